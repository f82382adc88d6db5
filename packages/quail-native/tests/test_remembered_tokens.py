"""A query whose answers are all stored runs without parsing the model's tokenizer (nor importing torch): the
ids of its texts and prompt pieces are read from the answer store, where the first run left them."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap

from naive_reference import model_spec

from quail.cache import STORE_ENVIRONMENT

SCRIPT = """
import json, sys
import pyarrow as pa
import quail

registry = quail.ExtensionRegistry.with_built_ins()
spec = quail.ModelSpec(**json.loads({spec!r}))
registry.register_model(spec)
config = quail.EngineConfig(backend="native", model=spec.name, precision="fp32", calibration="off")
with quail.Session(config, registry=registry) as session:
    session.register("reviews", quail.DocumentProvider.from_table(
        pa.table({{"id": [1, 2, 3], "body": ["great acting", "dull plot", "a film — with ünïcode"]}}), "id"))
    result = session.sql("SELECT r.id FROM reviews r WHERE AI_FILTER(PROMPT('Is {{0}} praise?', r.body)) "
                         "OR AI_FILTER(PROMPT('Is {{0}} short?', r.body))").run()
print(json.dumps({{"ids": sorted(result.collect().column(0).to_pylist()), "answers": result.report["answers"],
                  "tokenizers": "tokenizers" in sys.modules, "torch": "torch" in sys.modules}}))
"""


def test_a_query_answered_from_the_store_parses_no_tokenizer(tiny_checkpoints, tmp_path):
    spec = json.dumps(dataclasses.asdict(model_spec("gemma3", tiny_checkpoints["gemma3"].path)), default=str)
    script = textwrap.dedent(SCRIPT.format(spec=spec))
    environment = {**os.environ, STORE_ENVIRONMENT: str(tmp_path / "answers.sqlite")}
    runs = []
    for _ in range(2):
        run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                             env=environment)
        assert run.returncode == 0, run.stderr
        runs.append(json.loads(run.stdout.splitlines()[-1]))
    first, second = runs
    assert first["tokenizers"] and first["torch"] and first["answers"]["computed"] > 0
    everything = first["answers"]["computed"] + first["answers"]["stored"]
    assert second == {**first, "answers": {"stored": everything, "computed": 0, "duplicates": 0},
                      "tokenizers": False, "torch": False}
