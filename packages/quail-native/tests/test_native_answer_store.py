"""The answer store on the native backend with tiny random checkpoints: new processes, other models, kill -9.

* a query run again in a new process computes nothing, never boots an engine, and gives the
  same rows and bit-identical margins;
* changing its SELECT list computes nothing; adding a filter computes only that filter's answers;
* another checkpoint registered under the same name, or the same one in bf16, reads none of them;
* `quail query` killed with SIGKILL part-way leaves a sound store, and run again computes exactly the
  answers the killed run had not committed, with the rows of an uninterrupted run.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tiny_models
from naive_reference import TinyModel, model_spec
from test_exactness import ACTING, DISCUSS, ID_COLUMNS, POSITIVE, TABLES, sql_prompt

import quail
from quail.cache import STORE_ENVIRONMENT

CHILD = Path(__file__).with_name("answer_store_child.py")
QUERY = (f"SELECT r.id, a.aspect, AI.SCORE({sql_prompt(POSITIVE, 'r.body')}) AS positive, "
         f"AI.CLASSIFY(r.body, ['praise', 'complaint']) AS tone FROM reviews r JOIN aspects a "
         f"ON AI_FILTER({sql_prompt(DISCUSS, 'r.body', 'a.aspect')}) WHERE AI_FILTER({sql_prompt(ACTING, 'r.body')})")
FILTER = f"SELECT r.id FROM reviews r WHERE AI_FILTER({sql_prompt(ACTING, 'r.body')})"
TWO_FILTERS = FILTER + " AND AI_FILTER(PROMPT('Is {0} about the music?', r.body))"


def session_on(model: quail.ModelSpec, **fields: Any) -> quail.Session:
    registry = quail.ExtensionRegistry.with_built_ins()
    registry.register_model(model)
    config = quail.EngineConfig(model=model.name, chunk_tokens=160, **{"precision": "fp32", **fields})
    session = quail.Session(config, registry=registry)
    for name, table in TABLES.items():
        session.register(name, quail.DocumentProvider.from_table(table, ID_COLUMNS[name]))
    return session


def run(model: quail.ModelSpec, sql: str, **fields: Any) -> quail.QueryResult:
    with session_on(model, **fields) as session:
        return session.sql(sql).run()


@pytest.fixture
def qwen3(tiny_checkpoints: dict[str, TinyModel]) -> quail.ModelSpec:
    return tiny_checkpoints["qwen3"].spec


def child_run(job: dict[str, Any], path: Path) -> dict[str, Any]:
    path.write_text(json.dumps(job))
    done = subprocess.run([sys.executable, str(CHILD), str(path)], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_query_run_again_in_a_new_process_computes_nothing_with_the_same_rows_and_margins(qwen3, tmp_path):
    tables = {}
    for name in ("reviews", "aspects"):
        pq.write_table(TABLES[name], tmp_path / f"{name}.parquet")
        tables[name] = [str(tmp_path / f"{name}.parquet"), ID_COLUMNS[name]]
    job = {"model": dataclasses.asdict(qwen3), "config": {"chunk_tokens": 160, "precision": "fp32"}, "tables": tables,
           "sql": QUERY}
    first = child_run(job, tmp_path / "job.json")
    again = child_run(job, tmp_path / "job.json")
    assert first["report"]["fresh_tokens"] > 0 and first["report"]["answers"]["stored"] == 0
    assert again["report"]["fresh_tokens"] == 0 and again["report"]["answers"]["computed"] == 0
    assert again["report"]["boot_kind"] is None and not again["engine_loaded"], "no engine was booted"
    assert again["rows"] == first["rows"] and first["rows"]
    assert again["answers"] == first["answers"], "every margin, score and label log-probability bit for bit"
    kinds = {json.dumps(sorted(rows[0])) for rows in first["answers"].values() if rows}
    assert len(kinds) == 4, "filter, join, score and classify answers were all stored"


def test_a_new_select_list_computes_nothing_and_a_new_filter_only_its_own_answers(qwen3):
    first = run(qwen3, FILTER)
    assert run(qwen3, FILTER.replace("SELECT r.id", "SELECT r.body, r.film")).report["fresh_tokens"] == 0
    added = run(qwen3, TWO_FILTERS)
    metrics = added.report["node_metrics"]["filter_r"]
    acting = first.answer_tables["filter_r"]
    assert metrics["stored_answers"] == acting.num_rows
    assert metrics["computed_answers"] == sum(acting.column("answer").to_pylist()) > 0
    assert 0 < added.report["fresh_tokens"] < run(qwen3, TWO_FILTERS, cache="off").report["fresh_tokens"]
    assert added.collect().equals(run(qwen3, TWO_FILTERS, cache="off").collect())


def test_stored_margins_are_the_computed_ones_bit_for_bit(qwen3):
    computed = run(qwen3, QUERY)
    stored = run(qwen3, QUERY)
    uncached = run(qwen3, QUERY, cache="off")
    assert stored.report["answers"]["computed"] == 0
    for node, table in computed.answer_tables.items():
        assert stored.answer_tables[node].equals(table), node
        other, floats = uncached.answer_tables[node], sorted(MARGINS & set(table.column_names))
        assert other.drop_columns(floats).equals(table.drop_columns(floats)), node
        for name in floats:
            worst = max(abs(a - b) for a, b in zip(flat(other.column(name)), flat(table.column(name)), strict=True))
            assert worst < 1e-5, f"{node}.{name}: committed calls pack differently, within float rounding only"


MARGINS = {"margin", "margins", "positive"}


def flat(column: pa.ChunkedArray) -> list[float]:
    values = column.to_pylist()
    return [v for row in values for v in row] if values and isinstance(values[0], list) else values


def test_other_weights_under_the_same_name_or_another_precision_read_no_stored_answer(qwen3, tmp_path):
    run(qwen3, FILTER)
    other_dir = tiny_models.build("qwen3", tmp_path / "other", seed=7)
    other = model_spec("qwen3", other_dir)
    assert other.name == qwen3.name and other.source != qwen3.source
    for model, precision in ((other, "fp32"), (qwen3, "bf16")):
        result = run(model, FILTER, precision=precision)
        assert result.report["answers"]["stored"] == 0 and result.report["fresh_tokens"] > 0, (model.source,
                                                                                                precision)
    copied = tmp_path / "copied"
    shutil.copytree(Path(qwen3.source), copied)
    same = run(model_spec("qwen3", copied), FILTER)
    assert same.report["fresh_tokens"] == 0, "the same weights elsewhere are the same model"


# -- kill -9 ------------------------------------------------------------------------------------------------


CHAT_TOKENS = ("<|im_start|>", "<|im_end|>", "<think>", "</think>")


def hub_checkpoint(tiny: Path, home: Path) -> Path:
    """The tiny checkpoint where the catalog's qwen3-0.6b is looked for: a Hugging Face hub cache snapshot.

    The catalog's Qwen3 is a chat model, so its layout needs the chat control tokens a Qwen3 tokenizer
    has: they are added to the tokenizer, and the embedding gains a (zero) row for each.
    """
    import torch
    from safetensors.torch import load_file, save_file
    from tokenizers import AddedToken, Tokenizer

    snapshot = home / "hub" / "models--Qwen--Qwen3-0.6B" / "snapshots" / "tiny"
    shutil.copytree(tiny, snapshot)
    tokenizer = Tokenizer.from_file(str(snapshot / "tokenizer.json"))
    tokenizer.add_special_tokens([AddedToken(token, special=True) for token in CHAT_TOKENS])
    tokenizer.save(str(snapshot / "tokenizer.json"))
    config = json.loads((snapshot / "config.json").read_text())
    config["vocab_size"] = tokenizer.get_vocab_size()
    (snapshot / "config.json").write_text(json.dumps(config))
    weights = load_file(str(snapshot / "model.safetensors"))
    for name, tensor in list(weights.items()):
        if tensor.dim() == 2 and tensor.shape[0] == len(tensor) and name.endswith(("embed_tokens.weight",
                                                                                   "lm_head.weight")):
            extra = torch.zeros(config["vocab_size"] - tensor.shape[0], tensor.shape[1], dtype=tensor.dtype)
            weights[name] = torch.cat((tensor, extra))
    save_file(weights, str(snapshot / "model.safetensors"))
    return snapshot


def many_reviews(path: Path, count: int) -> Path:
    words = " ".join(TABLES["reviews"].column("body").to_pylist()).split()
    sample = random.Random(0)
    bodies = [" ".join(sample.choice(words) for _ in range(10)) + f" {i}" for i in range(count)]
    pq.write_table(pa.table({"id": list(range(count)), "body": bodies}), path)
    return path


def answers_in(store: Path) -> int:
    """Answers committed to the store so far, read as another process would (0 before it exists)."""
    try:
        with sqlite3.connect(f"file:{store}?mode=ro", uri=True) as db:
            return int(db.execute("SELECT count(*) FROM answers").fetchone()[0])
    except sqlite3.OperationalError:  # not created yet
        return 0


def report_value(output: str, key: str) -> str:
    [line] = [line for line in output.splitlines() if line.strip().startswith(f"{key}:")]
    return line.split(":", 1)[1].strip()


def report_number(output: str, key: str) -> int:
    """A count of the printed report (printed for people: with thousands separators)."""
    return int(report_value(output, key).replace(",", ""))


@pytest.mark.slow
def test_a_query_killed_part_way_resumes_with_what_it_committed(tiny_checkpoints, tmp_path):
    home, count = tmp_path / "hf", 1500
    hub_checkpoint(tiny_checkpoints["qwen3"].path, home)
    table = many_reviews(tmp_path / "reviews.parquet", count)
    store = Path(os.environ[STORE_ENVIRONMENT])
    environment = {**os.environ, "HF_HOME": str(home), "OMP_NUM_THREADS": "1",
                   "TMPDIR": str(tmp_path)}  # SIGKILL leaves its temporary files: here, not in /tmp

    def query(cache: str, out: Path) -> list[str]:
        return [sys.executable, "-m", "quail.cli", "query", FILTER, "-t", f"reviews={table}", "--model",
                "qwen3-0.6b", "--chunk-tokens", "512", "--cache", cache, "--no-progress", "-o", str(out)]

    killed = subprocess.Popen(query("auto", tmp_path / "killed.json"), env=environment, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE)
    deadline = time.monotonic() + 300
    while answers_in(store) < count // 5 and killed.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert killed.poll() is None, "the query ended before it could be killed part-way: " + killed.stderr.read().decode()
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    with sqlite3.connect(store) as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    committed = answers_in(store)
    assert count // 5 <= committed < count

    resumed = subprocess.run(query("auto", tmp_path / "resumed.json"), env=environment, capture_output=True,
                             text=True, timeout=600)
    whole = subprocess.run(query("off", tmp_path / "whole.json"), env=environment, capture_output=True, text=True,
                           timeout=600)
    assert resumed.returncode == 0 and whole.returncode == 0, resumed.stderr + whole.stderr
    answers = re.fullmatch(r"([\d,]+) stored, ([\d,]+) computed, ([\d,]+) copied from identical prompts",
                           report_value(resumed.stdout, "answers"))
    assert answers is not None, report_value(resumed.stdout, "answers")
    stored, computed = (int(answers[k].replace(",", "")) for k in (1, 2))
    assert (stored, computed) == (committed, count - committed), "exactly what was not committed"
    fresh, total = report_number(resumed.stdout, "fresh_tokens"), report_number(whole.stdout, "fresh_tokens")
    assert abs(fresh / total - (count - committed) / count) < 0.05, (fresh, total, committed)
    assert json.loads((tmp_path / "resumed.json").read_text()) == json.loads((tmp_path / "whole.json").read_text())
