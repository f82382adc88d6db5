"""Planning on the native backend reads the checkpoint's tokenizer and config without torch: with the
answer store off, a precision given, or the CPU's precision probe remembered, `explain` skips the seconds a
torch import takes on a slow machine."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from naive_reference import model_spec

from quail_native.precision_record import RECORDS_ENVIRONMENT

SCRIPT = """
import json, sys
import pyarrow as pa
import quail

registry = quail.ExtensionRegistry.with_built_ins()
spec = quail.ModelSpec(**json.loads({spec!r}))
registry.register_model(spec)
config = quail.EngineConfig(backend="native", model=spec.name, precision={precision!r}, cache={cache!r})
with quail.Session(config, registry=registry) as session:
    session.register("reviews", quail.DocumentProvider.from_table(
        pa.table({{"id": [1, 2], "body": ["great acting", "dull plot"]}}), "id"))
    plan = session.sql("SELECT r.id FROM reviews r WHERE AI_FILTER(PROMPT('Is {{0}} praise?', r.body))").explain()
print(json.dumps({{"torch": "torch" in sys.modules, "planned": "AiFilter" in plan}}))
"""


def explain_in_a_new_process(checkpoint: Path, kind: str, precision: str, cache: str,
                             environment: dict[str, str] | None = None) -> dict[str, bool]:
    spec = json.dumps(dataclasses.asdict(model_spec(kind, checkpoint)), default=str)
    script = textwrap.dedent(SCRIPT.format(spec=spec, precision=precision, cache=cache))
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                         env=environment)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout.splitlines()[-1])


def test_explaining_a_query_imports_no_torch(tiny_checkpoints):
    for kind, precision, cache in (("gemma3", "auto", "off"), ("qwen3", "fp32", "auto"), ("gemma3", "bf16", "auto")):
        assert explain_in_a_new_process(tiny_checkpoints[kind].path, kind, precision, cache) == {
            "torch": False, "planned": True}, kind


def test_auto_precision_with_the_answer_store_probes_once_per_cpu(tiny_checkpoints, tmp_path):
    """The answer store's model identity holds the precision: on a CPU whose probe nothing remembers, the
    first process measures it (torch); every later one reads what it measured, without torch."""
    environment = {**os.environ, RECORDS_ENVIRONMENT: str(tmp_path)}
    checkpoint = tiny_checkpoints["gemma3"].path
    first = explain_in_a_new_process(checkpoint, "gemma3", "auto", "auto", environment)
    assert first == {"torch": True, "planned": True}
    assert len(list(tmp_path.glob("probe-*.json"))) == 1
    later = explain_in_a_new_process(checkpoint, "gemma3", "auto", "auto", environment)
    assert later == {"torch": False, "planned": True}
