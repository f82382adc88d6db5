"""One query in a process of its own, for the answer-store tests: `python answer_store_child.py JOB.json`.

The job names the model (a ModelSpec's fields), the engine settings, the tables (Parquet files)
and the SQL; the process prints its rows, report and answer tables as one JSON line (floats as
JSON numbers, which round-trip exactly), and whether it loaded the native executor.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq

import quail


def main(job_path: str) -> int:
    started = time.perf_counter()
    job = json.loads(Path(job_path).read_text())
    registry = quail.ExtensionRegistry.with_built_ins()
    model = quail.ModelSpec(**job["model"])
    registry.register_model(model)
    config = quail.EngineConfig(model=model.name, **job["config"])
    with quail.Session(config, registry=registry) as session:
        for name, (path, id_column) in job["tables"].items():
            session.register(name, quail.DocumentProvider.from_table(pq.read_table(path), id_column))
        result = session.sql(job["sql"]).run()
        report = result.report
        print(json.dumps({
            "rows": result.to_rows(),
            "report": {key: report[key] for key in ("fresh_tokens", "wall_s", "boot_kind", "answers")},
            "answers": {node: table.to_pylist() for node, table in sorted(result.answer_tables.items())},
            "process_s": time.perf_counter() - started,
            "engine_loaded": "quail_native.execution" in sys.modules,
        }))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
