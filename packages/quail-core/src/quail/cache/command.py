"""`quail cache stats` and `quail cache clear`: what the answer store holds, and starting it afresh."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TextIO

from quail.cache.access import store_location
from quail.cache.store import AnswerStore, NotAnAnswerStore, StoreError, is_locked, remove_files
from quail.config import DEFAULT_CACHE_LIMIT, EngineConfig

UNUSABLE = 2


def add_command(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = commands.add_parser("cache", help="the answer store: what it holds (stats), or empty it (clear)")
    parser.add_argument("action", choices=("stats", "clear"))
    parser.add_argument("--store", type=Path,
                        help="the store file (default: the one EngineConfig(cache='auto') uses)")
    parser.set_defaults(handler=run_cache_command)


def run_cache_command(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    out, err = out or sys.stdout, err or sys.stderr
    path: Path = args.store or store_location(EngineConfig())
    if args.action == "stats":
        return _stats(path, out, err)
    return _clear(path, out, err)


def _stats(path: Path, out: TextIO, err: TextIO) -> int:
    if not path.exists():
        print(f"no answer store at {path} (nothing has been stored there yet)", file=out)
        return 0
    try:
        store = AnswerStore.open(path, DEFAULT_CACHE_LIMIT)
        try:
            stats = store.stats()
        finally:
            store.close()
    except NotAnAnswerStore as error:
        print(f"quail: {error}", file=err)
        return UNUSABLE
    except StoreError as error:
        print(f"quail: {error}{_advice(error)}", file=err)
        return UNUSABLE
    print(f"answer store {stats.path}: {stats.answers:,} answers, {stats.token_lists:,} texts' token ids, "
          f"{stats.bytes_on_disk / 2**20:.2f} MiB on disk", file=out)
    for model in stats.models:
        kinds = ", ".join(f"{count:,} {kind}" for kind, count in sorted(model.answers.items()))
        print(f"  {model.description} [{model.identity[:12]}]: {kinds}", file=out)
    return 0


def _clear(path: Path, out: TextIO, err: TextIO) -> int:
    if not path.exists():
        print(f"no answer store at {path}: nothing to clear", file=out)
        return 0
    try:
        store = AnswerStore.open(path, DEFAULT_CACHE_LIMIT)
    except NotAnAnswerStore as error:
        print(f"quail: {error}", file=err)
        return UNUSABLE
    except StoreError as error:
        if is_locked(error):
            print(f"quail: {error}{_advice(error)}", file=err)
            return UNUSABLE
        try:
            remove_files(path)
        except (NotAnAnswerStore, OSError) as refused:
            print(f"quail: {refused}", file=err)
            return UNUSABLE
        print(f"removed the unusable answer store {path} ({error.__cause__ or error})", file=out)
        return 0
    try:
        removed = store.clear()
    except StoreError as error:
        print(f"quail: {error}", file=err)
        return UNUSABLE
    finally:
        store.close()
    print(f"removed {removed.answers:,} answers and {removed.token_lists:,} texts' token ids from {path}", file=out)
    return 0


def _advice(error: StoreError) -> str:
    """What to do about a store Quail made but cannot use now: wait for a writer, or clear a damaged one."""
    if is_locked(error):
        return "; another Quail process is writing to it: try again when it has finished"
    return "; `quail cache clear` deletes it (it carries Quail's marker)"
