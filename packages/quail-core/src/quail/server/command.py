"""`quail serve`: the command line's options, the two sessions over the registered tables, and uvicorn.

The server binds its socket before it prints where it listens (port 0 picks a free port, which is what is
printed). SIGTERM and Ctrl-C stop it cleanly: no new query is taken, the queued ones are cancelled, the running
one is stopped at its next step, open event streams end with the job's last state, the sessions remove their
files and the engines are closed — then the process exits 128 + the signal's number, as every quail command.
"""

from __future__ import annotations

import argparse
import socket
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, TextIO

from quail.config import EngineConfig
from quail.errors import UsageError
from quail.query_cli import ENGINE_OPTIONS, TableArgument, add_engine_arguments, engine_config, table_arguments
from quail.server.settings import DEFAULT_PORT, ServerSettings, read_file

if TYPE_CHECKING:
    import uvicorn

    from quail.server.app import ServerState
    from quail.session import Session

SHUTDOWN_WAIT_S = 30.0
"""How long a stopping server waits for the running query to unwind after it was cancelled."""


def add_command(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    serve = commands.add_parser("serve", help="serve one warm engine over HTTP: an API, a Python client "
                                              "(quail.connect) and a web page")
    serve.add_argument("--host", help="address to listen on (default 127.0.0.1; any other address needs a token)")
    serve.add_argument("--port", type=int, help=f"port (default {DEFAULT_PORT}; 0 picks a free one)")
    serve.add_argument("--token", help="the bearer token clients send (generated and printed when the address is "
                                       "not loopback and none is given)")
    serve.add_argument("--config", type=Path, help="a TOML file with [server], [engine] and [tables] sections; "
                                                   "options given here win")
    serve.add_argument("-t", "--table", action="append", default=[], metavar="NAME=PATH[:ID_COL]",
                       help="register a table (as for quail query); clients query only these")
    serve.add_argument("--dialect", choices=("snowflake", "bigquery"), help="the dialect of a request that names "
                                                                            "none")
    serve.add_argument("--max-request-bytes", type=int, help="largest request body taken (default 1 MiB)")
    serve.add_argument("--max-result-bytes", type=int, help="largest result sent (default 256 MiB)")
    add_engine_arguments(serve)
    serve.set_defaults(handler=run_serve_command)


def settings_of(args: argparse.Namespace) -> ServerSettings:
    """The file's settings under the command line's: each value from the command line when given there."""
    file = read_file(args.config) if args.config is not None else None
    engine = dict(file.engine) if file else {}
    engine.update({key: getattr(args, key) for key in ENGINE_OPTIONS if getattr(args, key) is not None})
    config = engine_config(engine)
    server = dict(file.server) if file else {}
    for key in ("host", "port", "token", "dialect", "max_request_bytes", "max_result_bytes"):
        if getattr(args, key) is not None:
            server[key] = getattr(args, key)
    tables = table_arguments([*(file.tables if file else ()), *args.table])
    try:
        return ServerSettings(config=config, tables=tuple(tables), **server)  # type: ignore[arg-type]
    except TypeError as error:
        raise UsageError(f"--config {args.config}: {error}") from None


def run_serve_command(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    settings = settings_of(args).resolved()
    try:
        import starlette  # noqa: F401 — the app's framework, checked before anything starts
        import uvicorn
    except ImportError:
        raise UsageError("quail serve needs Starlette and uvicorn: pip install 'quail-core[serve]'") from None
    from quail.compute.lifetime import release_engines
    from quail.server.app import build_app

    state = open_state(settings)
    try:
        listening = _bound_socket(settings.host, settings.port)
    except BaseException:
        state.close(SHUTDOWN_WAIT_S)
        raise
    host, port = listening.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host

    def shut_down() -> None:
        try:
            state.close(SHUTDOWN_WAIT_S)
        finally:
            release_engines()

    app = build_app(state, on_shutdown=shut_down)
    config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=5, lifespan="on")
    server = _server_class()(config, state)
    fragment = f"#token={settings.token}" if settings.token else ""
    print(f"quail serve: http://{shown}:{port}/{fragment}", file=out, flush=True)
    print(f"  model {state.planning.model.name} on {state.planning.backend.name} ({state.planning.device.name}); "
          f"tables: {', '.join(sorted(state.planning.catalog)) or 'none'}", file=out, flush=True)
    if settings.token:
        print(f"  token: {settings.token}  (send 'Authorization: Bearer <token>'; quail.connect(url, token=...))",
              file=out, flush=True)
    try:
        server.run(sockets=[listening])  # after a signal's clean shutdown uvicorn raises the signal again: exit 128 + n
    finally:
        listening.close()
        if not server.started:  # the lifespan never ran, so its shutdown did not either
            shut_down()
        print("quail serve: stopped", file=out, flush=True)
    return 0


def open_state(settings: ServerSettings) -> ServerState:
    """The planning session and the running one, each with every table registered; nothing stays open if a table
    cannot be read."""
    from quail.server.app import ServerState
    from quail.server.jobs import Scheduler

    planning = _session(settings.config, settings.tables)
    try:
        running = _session(settings.config, settings.tables)
    except BaseException:
        planning.close()
        raise
    return ServerState(settings, planning, Scheduler(running, max_result_bytes=settings.max_result_bytes))


def _session(config: EngineConfig, tables: tuple[TableArgument, ...]) -> Session:
    from quail.session import Session

    session = Session(config)
    try:
        for table in tables:
            table.register(session)
    except BaseException:
        session.close()
        raise
    return session


def _bound_socket(host: str, port: int) -> socket.socket:
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    listening = socket.socket(family, kind, proto)
    listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listening.bind(address)
    except OSError as error:
        listening.close()
        raise UsageError(f"cannot listen on {host}:{port}: {error.strerror or error}") from None
    listening.listen(128)
    listening.setblocking(False)
    return listening


def _server_class() -> type[uvicorn.Server]:
    """Made when serving: uvicorn is imported only then (the `serve` extra)."""
    import uvicorn

    class QuailServer(uvicorn.Server):
        """uvicorn's server that, on SIGTERM or Ctrl-C, first tells the app to stop: queued and running queries are
        cancelled and event streams end, so the graceful shutdown does not wait on them."""

        def __init__(self, config: uvicorn.Config, state: ServerState) -> None:
            super().__init__(config)
            self.quail_state = state

        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            # A signal handler runs between two bytecodes of the main thread, maybe inside a job's lock: the
            # cancelling, which takes locks, goes to a thread of its own.
            threading.Thread(target=self.quail_state.begin_stopping, name="quail-serve-stopping", daemon=True).start()
            super().handle_exit(sig, frame)

    return QuailServer
