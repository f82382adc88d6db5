"""The example third-party backend (examples/quail-transformers), as a third party would ship it: built and
installed from a directory outside the repository, found through its entry point, written against `quail.extend`
alone — and answering filters, joins, scores and labels as the native backend does, number for number."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.plugins  # it needs the first-party plugins (or ray) installed

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "quail-transformers"
CHILD = Path(__file__).resolve().parent / "support" / "example_backend_run.py"
MODEL = "gemma-3-270m"


def test_the_example_imports_nothing_of_quail_but_quail_and_quail_extend():
    for path in (EXAMPLE / "src").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            modules = [node.module] if isinstance(node, ast.ImportFrom) and node.module else \
                [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            for module in modules:
                if module.split(".")[0] == "quail":
                    assert module in ("quail", "quail.extend"), f"{path.name} imports {module}"


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example copied out of the repository, built and installed into a directory of its own."""
    work = tmp_path_factory.mktemp("third-party")
    source = shutil.copytree(EXAMPLE, work / "source")
    site = work / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--target", str(site), str(source)], check=True, cwd=work)
    assert (site / "quail_transformers").is_dir()
    return site


@pytest.mark.slow
def test_the_installed_example_answers_every_model_node_kind_as_native_does(installed: Path):
    env = {**os.environ, "PYTHONPATH": str(installed)}
    done = subprocess.run([sys.executable, str(CHILD), MODEL], capture_output=True, text=True, env=env,
                          cwd=installed.parent, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    native, example = found["native"], found["transformers"]
    assert example["distribution"] == "quail-transformers-example"  # found through its entry point
    assert set(native["answers"]) == {"filter", "join", "score", "labels"}
    for query, expected in native["answers"].items():
        got = example["answers"][query]
        assert len(got["rows"]) == len(expected["rows"]), query
        for mine, theirs in zip(got["rows"], expected["rows"], strict=True):
            assert [pytest.approx(v, abs=1e-3) if isinstance(v, float) else v for v in theirs] == mine, query
        assert len(got["numbers"]) == len(expected["numbers"]), query
        for mine, theirs in zip(got["numbers"], expected["numbers"], strict=True):
            assert mine == pytest.approx(theirs, abs=1e-3), query
