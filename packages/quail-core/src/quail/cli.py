"""The `quail` command line."""

from __future__ import annotations

import argparse
import errno
import gc
import sys
import tempfile
import traceback
from collections.abc import Sequence

from quail.interrupts import Terminated, signals_unwind

USER_ERROR = 2
INTERNAL_ERROR = 1
INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for Ctrl-C


def main(argv: Sequence[str] | None = None) -> int:
    """0 on success, 2 on a user error (message, no traceback), 1 on an internal error, 128 + n on signal n.

    Everything heavy is imported inside, so an interrupt while pyarrow or torch load is an
    interrupt like any other: a one-line message and exit 130.
    """
    with signals_unwind():
        try:
            return _run(argv)
        except KeyboardInterrupt:
            print("quail: interrupted", file=sys.stderr)
            return INTERRUPTED
        except Terminated as signal:
            print("quail: terminated", file=sys.stderr)
            return 128 + signal.signal_number


def entry_point() -> int:
    """The `quail` console script and `python -m quail.cli`: `main`, then the process exits.

    Before it does, every object is moved out of the collector's reach (`gc.freeze`): the collections the
    interpreter runs while shutting down would otherwise walk everything torch, pyarrow and the model
    made — measured 0.9–1.1 s of a 5–6 s three-row query here, 0.2–0.3 s frozen. Nothing is skipped that
    cleans up: sessions, workers and temporary files are closed before `main` returns, and atexit
    handlers still run. Only for a process that ends now; `main` itself can be called again.

    Not when an extension built with nanobind is loaded (`LEAK_CHECKED`, e.g. triton, which vLLM
    imports): it reports every object of its types still alive at exit as a leak, and frozen objects
    are never collected — a hundred lines of "nanobind: leaked" after a vLLM query.
    """
    code = main()
    if not any(name in sys.modules for name in LEAK_CHECKED):
        gc.freeze()
    return code


LEAK_CHECKED = ("triton",)
"""Extension modules that check for leaked objects when the interpreter finalises."""


def _run(argv: Sequence[str] | None) -> int:
    from quail.errors import QuailError

    parser = _parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args))
    except QuailError as exc:
        print(f"quail: {exc}", file=sys.stderr)
        return USER_ERROR
    except OSError as exc:
        if not _disk_full(exc):
            return _internal_error()
        where = f" writing {exc.filename}" if exc.filename else ""
        print(f"quail: no space left on the device{where} (temporary files go to {tempfile.gettempdir()}, "
              "TMPDIR chooses another place); nothing was left behind", file=sys.stderr)
        return USER_ERROR
    except Exception:
        return _internal_error()


def _internal_error() -> int:
    print("quail: internal error — please report it with the traceback below", file=sys.stderr)
    traceback.print_exc()
    return INTERNAL_ERROR


def _disk_full(error: OSError) -> bool:
    """A full disk or quota: the machine's state, not a bug (pyarrow's errors may carry only the message)."""
    return error.errno in (errno.ENOSPC, errno.EDQUOT) or "No space left on device" in str(error)


def _parser() -> argparse.ArgumentParser:
    from quail.cache.command import add_command as add_cache_command
    from quail.config import DEFAULT_BACKEND, DEFAULT_DEVICE, DEFAULT_MODEL
    from quail.plugins.loading import add_plugin_commands
    from quail.query_cli import add_arguments as add_query_arguments
    from quail.query_cli import run_query_command
    from quail.server.command import add_command as add_serve_command

    parser = argparse.ArgumentParser(prog="quail", description="Quail: AI functions in SQL.")
    commands = parser.add_subparsers(dest="command", required=True)
    backends = commands.add_parser("backends", help="list discovered backends and their status")
    backends.add_argument("--model", default=DEFAULT_MODEL)
    backends.add_argument("--device", default=DEFAULT_DEVICE)
    backends.add_argument("--gpus", type=int, default=1, help="devices per session (default: 1)")
    backends.set_defaults(handler=_backends)
    demo = commands.add_parser("demo", help="run the main demo query on the embedded model")
    demo.add_argument("--model", default=DEFAULT_MODEL)
    demo.add_argument("--device", default=DEFAULT_DEVICE)
    demo.add_argument("--backend", default=DEFAULT_BACKEND)
    demo.set_defaults(handler=_demo)
    query = commands.add_parser("query", help="run an AI SQL query over Parquet / CSV / JSONL / Arrow tables")
    add_query_arguments(query)
    query.set_defaults(handler=run_query_command)
    add_serve_command(commands)
    add_cache_command(commands)
    add_plugin_commands(commands)
    return parser


def _demo(args: argparse.Namespace) -> int:
    from quail.config import EngineConfig
    from quail.demo import run_demo

    return run_demo(EngineConfig(model=args.model, device=args.device, backend=args.backend))


def _backends(args: argparse.Namespace) -> int:
    from quail.arguments import check_device_count
    from quail.config import EngineConfig
    from quail.plugins.registry import ExtensionRegistry
    from quail.plugins.status import backend_statuses

    registry = ExtensionRegistry.with_built_ins()
    model = registry.model(args.model)
    device = registry.device(args.device)
    check_device_count(EngineConfig(device=device.name, gpus=args.gpus), device)
    print(f"backends for model {model.name} on device {device.name} ({args.gpus} device(s)):")
    rows = backend_statuses(registry, model, device, args.gpus)
    width = max((len(r.name) for r in rows), default=4)
    dist_width = max((len(r.distribution) for r in rows), default=4)
    for row in rows:
        print(f"  {row.name:<{width}}  {row.distribution:<{dist_width}}  {row.status}")
    for failure in registry.plugin_failures:
        print(f"  ! {failure.describe()}")
    return 0


if __name__ == "__main__":
    sys.exit(entry_point())
