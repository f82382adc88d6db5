"""The README's picture of `quail serve`: the page in Debian's chromium after a query on the default model.

    python dev/serve_screenshot.py [--model NAME] [--out docs/images/serve.png]

Starts `quail serve` on a free port with the bundled reviews and aspects, runs one query from the page as a
person would (type, Run), waits for its rows and saves a screenshot. Needs playwright and /usr/bin/chromium.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from pathlib import Path

from playwright.sync_api import sync_playwright

import quail.datasets

QUERY = ("SELECT r.id, r.title, r.stars\nFROM reviews r\n"
         "WHERE r.stars >= 4\n  AND AI_FILTER(PROMPT('Does the review praise the acting? {0}', r.body))\nORDER BY r.id")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default=None)
    parser.add_argument("--out", type=Path, default=Path("docs/images/serve.png"))
    args = parser.parse_args()
    data = Path(quail.datasets.__file__).parent
    command = [sys.executable, "-m", "quail.cli", "serve", "--port", "0",
               "-t", f"reviews={data / 'reviews.jsonl'}:id", "-t", f"aspects={data / 'aspects.jsonl'}:id",
               *(["--model", args.model] if args.model else [])]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        if not line.startswith("quail serve: http://"):
            raise SystemExit(f"quail serve did not start: {line}")
        url = line.split(": ", 1)[1].strip()
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1280, "height": 860})
            page.set_default_timeout(600_000)
            page.goto(url)
            page.wait_for_selector("#tables li[data-table=reviews]")
            page.fill("#sql", QUERY)
            page.click("#run")
            page.wait_for_function("() => document.querySelector('#status').textContent.startsWith('finished')")
            args.out.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(args.out), full_page=False)
            print(f"wrote {args.out}: {page.inner_text('#status')}")
            browser.close()
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(60)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
