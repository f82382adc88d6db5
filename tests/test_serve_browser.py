"""The web page of `quail serve` in a real browser: Playwright driving Debian's chromium against a real server on a
real model (Gemma 3 270M): load the page, write a query, run it, watch progress, read the rows, explain, see a
CompileError at its position, chart a GROUP BY, cancel a long query."""

from __future__ import annotations

import shutil

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (dev/requirements-test.txt)")

from support.serving import DATASETS, TOKEN, start_server  # noqa: E402

import quail  # noqa: E402
from quail.config import EngineConfig  # noqa: E402

CHROMIUM = shutil.which("chromium")
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (apt install chromium; "
                                                          "./dev/test.sh installs it where it can)")]

FILTER = ("SELECT r.id, r.title FROM reviews r\n"
          "WHERE AI_FILTER(PROMPT('Is this movie review positive? {0}', r.body))\nORDER BY r.id")
GROUPED = ("SELECT r.sentiment, COUNT(*) AS reviews FROM reviews r\n"
           "WHERE AI_FILTER(PROMPT('Is this movie review positive? {0}', r.body))\nGROUP BY r.sentiment ORDER BY 1")
BAD = "SELECT r.id\nFROM reviews r\nWHERE AI_FILTER(PROMPT('Is it good? {0}', r.nope))"
LONG = ("SELECT a.id, b.id AS other FROM reviews a JOIN reviews b\n"
        "ON AI_FILTER(PROMPT('Do the reviews {0} and {1} agree about the film?', a.body, b.body))")


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    server = start_server(tmp_path_factory.mktemp("browser"), "--model", "gemma-3-270m")
    try:
        with sync_api.sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            try:
                opened = browser.new_page(viewport={"width": 1280, "height": 900})
                opened.set_default_timeout(120_000)
                opened.goto(f"{server.url}/#token={TOKEN}")
                yield opened
            finally:
                browser.close()
    finally:
        assert server.stop() in (0, 143)
    assert server.left_behind() == []


def local(sql: str):
    with quail.Session(EngineConfig(model="gemma-3-270m", cache="off")) as session:
        session.register("reviews", str(DATASETS / "reviews.jsonl"), id_column="id")
        return session.sql(sql).run().collect()


def submit(page, sql: str, button: str = "#run") -> None:
    page.fill("#sql", sql)
    page.click(button)


def test_the_page_lists_the_tables_and_their_columns_and_the_engine(page):
    page.wait_for_selector("#tables li[data-table=reviews]")
    columns = page.locator("#tables li[data-table=reviews] .column").all_inner_texts()
    assert columns[:3] == ["id", "title", "body"]
    assert "gemma-3-270m on native" in page.inner_text("#engine")
    assert page.evaluate("() => location.hash") == ""  # the token left the address bar


def test_a_query_runs_with_progress_and_its_rows_are_a_local_sessions(page):
    submit(page, FILTER)
    page.wait_for_selector("#progress .node progress")
    page.wait_for_function("() => document.querySelector('#status').textContent.startsWith('finished')")
    expected = local(FILTER)
    bar = page.locator("#progress .node progress").first
    assert bar.evaluate("b => b.value === b.max")
    shown = page.locator("#results tbody tr").all()
    assert len(shown) == min(expected.num_rows, 50)
    ids = [int(row.locator("td").first.inner_text()) for row in shown]
    assert ids == expected.column("id").to_pylist()[:50]
    assert f"of {expected.num_rows}" in page.inner_text("#rows-shown")
    page.click(".tabs button[data-tab=report]")
    assert page.inner_text("#report dd[data-key='fresh tokens']") not in ("", "–")
    assert page.inner_text("#report dd[data-key=wall]").endswith(" s")


def test_explain_shows_the_plan_without_running(page):
    submit(page, FILTER, "#explain")
    page.wait_for_function("() => document.querySelector('#status').textContent.startsWith('plan ready')")
    assert "AiFilter" in page.inner_text("#plan")
    assert page.is_visible("#plan")


def test_a_compile_error_is_shown_at_its_position(page):
    submit(page, BAD)
    page.wait_for_selector("#error:not([hidden])")
    text = page.inner_text("#error")
    assert text.startswith("CompileError:") and "nope" in text
    assert page.get_attribute("#error", "data-line") == "3"
    column = int(page.get_attribute("#error", "data-column"))
    selected = page.evaluate("() => { const a = document.querySelector('#sql'); return a.selectionStart; }")
    lines = BAD.split("\n")
    assert selected == len(lines[0]) + len(lines[1]) + 2 + column - 1


def test_a_group_by_result_is_charted(page):
    submit(page, GROUPED)
    page.wait_for_function("() => document.querySelector('#status').textContent.startsWith('finished')")
    page.click(".tabs button[data-tab=chart]")
    expected = local(GROUPED)
    assert page.locator("#chart svg rect").count() == expected.num_rows
    labels = page.locator("#chart svg text[text-anchor=end]").all_text_contents()
    assert labels == [str(v) for v in expected.column("sentiment").to_pylist()]


def test_a_long_query_is_cancelled_from_the_page(page):
    submit(page, LONG)
    page.wait_for_function("() => document.querySelector('#status').textContent === 'running'")
    page.wait_for_function("() => [...document.querySelectorAll('#progress progress')].some(b => b.value > 0)")
    page.click("#cancel")
    page.wait_for_function("() => document.querySelector('#status').textContent === 'cancelled'", timeout=60_000)
    assert page.is_enabled("#run") and not page.is_enabled("#cancel")
