"""`quail bench`: run the workloads on every backend that can run here, beside the naive baseline."""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

import quail
from quail import QueryResult
from quail.extend import ReportValue, answer_tokens, document_columns, forget_kv_caches
from quail_native.backend import NativeBackend
from quail_native.benchmark.computes import compute_lines, computes_of, labelled, shard_walls
from quail_native.benchmark.naive import NaiveModel
from quail_native.benchmark.steal import StealMeter
from quail_native.benchmark.workloads import Workload, selected, tables
from quail_native.precision import choose_precision, projection_rate, synchronize


@dataclass(frozen=True)
class Row:
    """One (workload, backend): the median of its timed repeats, and what every repeat agreed on."""

    workload: str
    backend: str
    wall_s: float
    """Median wall over the repeats, boot excluded."""
    spread: float
    """(slowest − fastest) ÷ median over the repeats: how much the machine moved under the measurement."""
    repeats: int
    naive_s: float | None
    fresh_tokens: int | None
    minimum_tokens: int | None
    sol_s: float | None
    estimated_s: float | None
    agreement: float | None
    efficiency: float | None
    rows: int
    compute: str = "local"
    shard_walls: tuple[float, ...] = ()
    """Wall seconds of each shard a distributed provider ran (empty on `local`)."""


@dataclass(frozen=True)
class Sample:
    """One timed run of a (workload, backend)."""

    wall_s: float
    result: QueryResult


def gemm_peak(device: torch.device, dtype: torch.dtype, sizes: tuple[int, ...] = (1024, 2048),
              repeats: int = 8) -> float:
    """Best GEMM FLOP/s of torch on `device` in `dtype`, measured now (best of several shapes and tries)."""
    best = 0.0
    for size in sizes:
        a = torch.randn(size, size, device=device).to(dtype)
        b = torch.randn(size, size, device=device).to(dtype)
        a @ b
        for _ in range(repeats):
            synchronize(device)
            started = time.perf_counter()
            a @ b
            synchronize(device)
            best = max(best, 2 * size ** 3 / (time.perf_counter() - started))
    return best


def device_peak(device: torch.device, hidden: int, ffn: int, rows: int) -> tuple[float, str]:
    """The ceiling for efficiency: the best GEMM rate measured here, in the dtype `auto` computes in (and which).

    The dtype is the engine's own `auto` choice (`choose_precision`: the precision probe, remembered per CPU),
    so the engine and this ceiling never disagree, before or after the run.
    A CPU without bf16 units multiplies bf16 hundreds of times slower than fp32 (0.2 vs ~160 GFLOP/s), so
    only that dtype is measured at size. Square GEMMs alone understate it: on a 2-core AVX-512 CPU a 256³ bf16
    GEMM ran at 244–330 GFLOP/s while the model's own projections, prepacked, ran at 385–440 — efficiencies
    over 100 % in all but name. So the rate is also measured on the model's two MLP shapes ([rows × hidden] @
    [hidden × 2·ffn] and [rows × ffn] @ [ffn × hidden], `rows` a full pass: the run's chunk of tokens) the way
    the model multiplies them, and the best of all is the ceiling.
    """
    dtype = choose_precision("auto", device, hidden, ffn).dtype
    name = "bf16" if dtype == torch.bfloat16 else "fp32"
    best = gemm_peak(device, dtype, sizes=(1024, 2048) if device.type == "cpu" else (4096, 8192))
    for inputs, outputs in ((hidden, 2 * ffn), (ffn, hidden)):
        best = max(best, projection_rate(dtype, device, rows, inputs, outputs, repeats=5))
    return best, name


def run(args: argparse.Namespace) -> int:
    from quail_native.models.locate import model_directory

    workloads = selected(args.workloads)
    args.out.mkdir(parents=True, exist_ok=True)
    device = torch.device("cpu" if args.device == "cpu" else "cuda")
    registry = quail.ExtensionRegistry.with_built_ins()
    model = registry.model(args.model)
    first_peak, precision = device_peak(device, model.hidden, model.ffn, args.chunk_tokens)
    model_dir = args.model_dir or model_directory(model)
    if args.model_dir is not None:
        model = replace(model, name=f"{model.name}-shaped", source=str(args.model_dir))
        registry.register_model(model)
    notes: list[str] = []
    if args.precision == "auto":  # one choice for every backend, so they are compared at the same precision
        choice = choose_precision("auto", device, model.hidden, model.ffn)
        args.precision = "bf16" if choice.dtype == torch.bfloat16 else "fp32"
        notes.append(f"precision for every backend: {choice.reason}")
    sessions = open_sessions(args, registry, model.name, notes)
    try:
        rows = measure_all(sessions, workloads, args.repeats, model_dir, device, first_peak,
                           model.non_embedding_params, notes)
        cache_line = (answer_cache_line(next(iter(sessions.values())).config, registry, args.scale, workloads[0])
                      if sessions else None)
    finally:
        for session in sessions.values():
            session.close()
        quail.release_engines()
    # measured again after the run: the better is the ceiling
    peak = max(first_peak, device_peak(device, model.hidden, model.ffn, args.chunk_tokens)[0])
    rows = [rescaled(r, first_peak / peak) for r in rows]
    notes.append(f"GEMM peak: torch {precision} on {device.type}, {peak / 1e9:.1f} GFLOP/s (the best of square GEMMs "
                 f"and the model's MLP projections, in the dtype precision auto computes in, before and after the "
                 f"run)")
    notes.append(f"each (workload, backend) warmed up once, then timed {args.repeats}× interleaved with the others; "
                 "walls are medians, spread = (slowest − fastest) ÷ median")
    if cache_line is not None:
        notes.append(cache_line)
    write_outputs(args.out, rows, notes, peak, precision)
    print_summary(rows, notes)
    return 0


def open_sessions(args: argparse.Namespace, registry: quail.ExtensionRegistry, model: str,
                  notes: list[str]) -> dict[str, quail.Session]:
    """A session per (backend, compute provider) that can run here, all open at once: their engines (and
    workers) stay booted side by side. Keyed by the label the output uses."""
    backends = [b for b in args.backends.split(",") if b]
    sessions: dict[str, quail.Session] = {}
    for backend in backends:
        for compute in computes_of(args.compute):
            config = quail.EngineConfig(model=model, backend=backend, device=args.device,
                                        chunk_tokens=args.chunk_tokens, precision=args.precision,
                                        engines_per_device=len(backends), compute=compute,
                                        workers=None if compute == "local" else args.workers,
                                        cache="off")  # the engine's work, every run
            try:
                session = quail.Session(config, registry=registry)
            except quail.QuailError as error:
                notes.append(f"{labelled(backend, compute)}: skipped — {error}")
                continue
            for name, load in tables(args.scale).items():
                session.register(name, quail.DocumentProvider.from_table(load(), "id"))
            sessions[labelled(backend, compute)] = session
    return sessions


def measure_all(sessions: dict[str, quail.Session], workloads: tuple[Workload, ...], repeats: int, model_dir: Path,
                device: torch.device, peak: float, params: int, notes: list[str]) -> list[Row]:
    """Warm every (workload, session) up once, then time `repeats` rounds, each over every workload and session
    in turn, so a slow stretch of the machine falls on all of them alike; a refused pair is reported, not fatal."""
    naive: NaiveModel | None = None
    samples: dict[tuple[str, str], list[Sample]] = {}
    refused: set[tuple[str, str]] = set()
    steal = StealMeter()
    for round_ in range(repeats + 1):
        for workload in workloads:
            for backend, session in sessions.items():
                key = (workload.name, backend)
                if key in refused:
                    continue
                try:
                    with steal.window() if round_ > 0 else nullcontext():
                        sample = timed_run(session, workload.sql)
                except quail.RefusalError as error:
                    refused.add(key)
                    notes.append(f"{workload.name} [{backend}]: refused — {error}")
                    continue
                if round_ > 0:  # round 0 warms up: boots, first-call kernel selection, caches
                    samples.setdefault(key, []).append(sample)
                    print(f"  {workload.name} [{backend}] run {round_}/{repeats}: {sample.wall_s:.2f} s")
    for taken in samples.values():
        for note in taken[0].result.report["engine"] or ():  # type: ignore[union-attr]
            if f"engine: {note}" not in notes:
                notes.append(f"engine: {note}")
    stolen = steal.note()
    if stolen is not None:
        notes.append(stolen)
    rows = []
    for (name, backend), taken in samples.items():
        session = sessions[backend]
        if naive is None:
            tokenizer = session.tokenizer or NativeBackend().tokenizer(session.model)
            naive = NaiveModel(model_dir, tokenizer, answer_tokens(tokenizer), device)
        workload = next(w for w in workloads if w.name == name)
        rows.append(row_of(session, workload, taken, naive, peak, params))
    return rows


@dataclass(frozen=True)
class CacheRun:
    seconds: float
    fresh_tokens: int | None


def answer_cache_line(config: quail.EngineConfig, registry: quail.ExtensionRegistry, scale: str,
                      workload: Workload) -> str:
    """One workload cold (an empty answer store) and warm (every answer stored), each in a new session."""
    with tempfile.TemporaryDirectory(prefix="quail-bench-answers-") as directory:
        stored = replace(config, cache=str(Path(directory) / "answers.sqlite"))
        cold, warm = (cache_run(stored, registry, scale, workload) for _ in range(2))
    ratio = warm.seconds / cold.seconds if cold.seconds else float("nan")
    return (f"ratio warm/cold wall (answer cache, {workload.name} [{config.backend}]): {ratio:.3f} — cold "
            f"{cold.seconds:.2f} s, warm {warm.seconds:.3f} s (plan + run, new session each); fresh tokens "
            f"{cold.fresh_tokens} → {warm.fresh_tokens}")


def cache_run(config: quail.EngineConfig, registry: quail.ExtensionRegistry, scale: str,
              workload: Workload) -> CacheRun:
    with quail.Session(config, registry=registry) as session:
        for name, load in tables(scale).items():
            session.register(name, quail.DocumentProvider.from_table(load(), "id"))
        started = time.perf_counter()
        report = session.sql(workload.sql).run().report
        fresh = report["fresh_tokens"]
        return CacheRun(time.perf_counter() - started, fresh if isinstance(fresh, int) else None)


def timed_run(session: quail.Session, sql: str) -> Sample:
    query = session.sql(sql)
    query.plan()  # planning (and tokenizing) is not what the run times
    forget_kv_caches()  # every run starts cold: no engine reads a prefix an earlier run left in its cache
    result = query.run()
    report = result.report
    return Sample(float(report["wall_s"]) - float(report["boot_s"] or 0.0), result)  # type: ignore[arg-type]


def row_of(session: quail.Session, workload: Workload, samples: list[Sample], naive: NaiveModel, peak: float,
           params: int) -> Row:
    walls = sorted(s.wall_s for s in samples)
    wall = statistics.median(walls)
    result = samples[0].result
    report = result.report
    query = session.sql(workload.sql)
    views = query.views()  # rows are addressed by position in each alias's scan view
    texts = {alias: views[alias].to_table([column]).column(column).to_pylist()
             for alias, column in document_columns(query.logical_plan).items()}
    baseline = naive.run(query.plan().graph, dict(result.answer_tables), texts)
    fresh = report["fresh_tokens"] if isinstance(report["fresh_tokens"], int) else None
    minimum = report["minimum_tokens"] if isinstance(report["minimum_tokens"], int) else None
    flops = model_flops(report, params)
    efficiency = flops / wall / peak if flops is not None and wall > 0 else None
    return Row(workload.name, session.backend.name, wall, (walls[-1] - walls[0]) / wall if wall else 0.0, len(walls),
               baseline.seconds, fresh, minimum, speed_of_light(flops, fresh, minimum, peak),
               _float(report["estimated_seconds"]), baseline.agreement, efficiency, result.count(),
               session.config.compute, shard_walls(report))


def speed_of_light(flops: float | None, fresh: int | None, minimum: int | None, peak: float) -> float | None:
    """Seconds the minimum model FLOPs take at the GEMM peak measured in this run: the run's own FLOPs scaled
    to the minimum tokens (each distinct prefix once), so work the plan did twice is not counted as the limit."""
    if flops is None or not fresh or minimum is None:
        return None
    return flops * min(minimum / fresh, 1.0) / peak


def rescaled(row: Row, factor: float) -> Row:
    """A row measured against a peak `factor` × the final one: efficiency and speed of light both scale."""
    return replace(row, efficiency=None if row.efficiency is None else row.efficiency * factor,
                   sol_s=None if row.sol_s is None else row.sol_s * factor)


def model_flops(report: dict[str, ReportValue], params: int) -> float | None:
    """The backend's own count of dense + attention FLOPs when it gives one, else 2·params per fresh token."""
    metrics = report["node_metrics"]
    counted = [m["model_flops"] for m in metrics.values() if isinstance(m, dict)] if isinstance(metrics, dict) else []
    known = [float(f) for f in counted if isinstance(f, int | float)]
    if known:
        return sum(known)
    fresh = report["fresh_tokens"]
    return 2.0 * params * fresh if isinstance(fresh, int) else None


def _float(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) else None


def write_outputs(out: Path, rows: list[Row], notes: list[str], peak: float, precision: str) -> None:
    (out / "results.json").write_text(json.dumps({"gemm_peak_flops": peak, "gemm_peak_precision": precision,
                                                  "rows": [asdict(r) for r in rows], "notes": notes}, indent=1))
    lines = ["# Quail benchmark", "", f"torch {precision} GEMM peak measured in this run: {peak / 1e9:.1f} GFLOP/s", "",
             "| workload | backend | wall s (median) | spread | naive s | native/naive | fresh | minimum | fresh/min | "
             "SoL s | agreement | % GEMM peak |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.workload} | {labelled(r.backend, r.compute)} | {r.wall_s:.2f} | "
                     f"{r.spread:.0%} of {r.repeats} | {r.naive_s or 0:.2f} | "
                     f"{r.wall_s / r.naive_s if r.naive_s else float('nan'):.3f} | {r.fresh_tokens} | "
                     f"{r.minimum_tokens} | {_ratio(r.fresh_tokens, r.minimum_tokens)} | {r.sol_s or 0:.2f} | "
                     f"{(r.agreement or 0):.1%} | {(r.efficiency or 0):.0%} |")
    lines += ["", *summary_lines(rows), *(f"- {n}" for n in notes)]
    (out / "report.md").write_text("\n".join(lines) + "\n")
    chart(out / "chart.png", rows)


def _ratio(a: int | None, b: int | None) -> str:
    return f"{a / b:.3f}" if a is not None and b else "?"


def chart(path: Path, rows: list[Row]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r.workload for r in rows]
    positions = range(len(rows))
    figure, axis = plt.subplots(figsize=(11, 5))
    axis.barh([p + 0.2 for p in positions], [r.naive_s or 0 for r in rows], height=0.4, label="naive transformers")
    axis.barh([p - 0.2 for p in positions], [r.wall_s for r in rows], height=0.4, label="quail native")
    axis.scatter([r.sol_s or 0 for r in rows], [p - 0.2 for p in positions], marker="|", s=300, color="black",
                 label="speed of light (minimum FLOPs at the measured peak)", zorder=3)
    axis.set_yticks(list(positions), names, fontsize=8)
    axis.set_xlabel("seconds")
    axis.invert_yaxis()
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def workload_lines(rows: list[Row]) -> list[str]:
    """Per workload, native's distance to its limits and its speed beside every other backend and naive."""
    lines = []
    others = [r for r in rows if r.backend != "native"]
    for r in (r for r in rows if r.backend == "native"):
        parts = [f"native {r.wall_s:.2f} s (spread {r.spread:.0%})"]
        if r.sol_s:
            parts.append(f"SoL/measured {r.sol_s / r.wall_s:.0%}")
        if r.efficiency is not None:
            parts.append(f"{r.efficiency:.0%} of GEMM peak")
        if r.naive_s:
            parts.append(f"{r.naive_s / r.wall_s:.1f}× naive")
        parts.append(f"fresh/minimum {_ratio(r.fresh_tokens, r.minimum_tokens)}")
        parts += [f"{o.wall_s / r.wall_s:.2f}× {o.backend}" for o in others if o.workload == r.workload]
        lines.append(f"{r.workload}: " + "; ".join(parts))
    return lines


def summary_lines(rows: list[Row]) -> list[str]:
    """Providers side by side first, then per-workload lines, other backends' wall ratios (vs naive and vs
    native on the same workloads), native's lines last — every ratio but the providers' over the `local` rows."""
    lines = compute_lines(rows)
    rows = [r for r in rows if r.compute == "local"]
    lines += workload_lines(rows)
    native = {r.workload: r for r in rows if r.backend == "native"}
    for backend in dict.fromkeys(r.backend for r in rows if r.backend != "native"):
        mine = [r for r in rows if r.backend == backend and r.naive_s]
        wall, naive = sum(r.wall_s for r in mine), sum(r.naive_s or 0 for r in mine)
        lines.append(f"ratio {backend}/naive wall: {wall / naive:.3f} over {len(mine)} queries" if naive else
                     f"ratio {backend}/naive wall: ?")
        paired = [(r, native[r.workload]) for r in mine if r.workload in native]
        if paired:
            ratio = sum(r.wall_s for r, _ in paired) / sum(n.wall_s for _, n in paired)
            lines.append(f"ratio {backend}/native wall: {ratio:.3f} over {len(paired)} queries (boot excluded)")
    return lines + backend_lines([r for r in rows if r.backend == "native"] or rows)


def backend_lines(rows: list[Row]) -> list[str]:
    timed = [r for r in rows if r.naive_s]
    wall, naive = sum(r.wall_s for r in timed), sum(r.naive_s or 0 for r in timed)
    fresh = sum(r.fresh_tokens or 0 for r in rows)
    minimum = sum(r.minimum_tokens or 0 for r in rows)
    sol = sum(r.sol_s or 0 for r in rows)
    efficiency = [r.efficiency for r in rows if r.efficiency is not None]
    agreement = min((r.agreement for r in rows if r.agreement is not None), default=1.0)
    return [
        f"ratio native/naive wall: {wall / naive:.3f} (speed-up {naive / wall:.2f}x over {len(timed)} queries)",
        f"ratio fresh/minimum tokens: {fresh / minimum:.3f}" if minimum else "ratio fresh/minimum tokens: ?",
        f"ratio SoL/measured wall: {sol / wall:.1%}" if wall else "ratio SoL/measured wall: ?",
        f"CPU efficiency (model FLOP/s ÷ GEMM peak): mean {sum(efficiency) / max(len(efficiency), 1):.0%}",
        f"lowest agreement with naive answers: {agreement:.1%}",
    ]


def print_summary(rows: list[Row], notes: list[str]) -> None:
    for note in notes:
        print(f"note: {note}")
    for line in summary_lines(rows):
        print(line)
