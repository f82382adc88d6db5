"""Planning on the native backend reads the checkpoint's tokenizer and config without torch: with the
answer store off (or a precision given), `explain` skips the seconds a torch import takes on a slow machine."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import textwrap

from naive_reference import model_spec

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


def test_explaining_a_query_imports_no_torch(tiny_checkpoints):
    for kind, precision, cache in (("gemma3", "auto", "off"), ("qwen3", "fp32", "auto"), ("gemma3", "bf16", "auto")):
        spec = json.dumps(dataclasses.asdict(model_spec(kind, tiny_checkpoints[kind].path)), default=str)
        script = textwrap.dedent(SCRIPT.format(spec=spec, precision=precision, cache=cache))
        run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr
        assert json.loads(run.stdout.splitlines()[-1]) == {"torch": False, "planned": True}, kind
