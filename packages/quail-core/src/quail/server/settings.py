"""What `quail serve` is told: where to listen, who may call, which tables and which engine — from the command
line and an optional TOML file, checked before anything starts."""

from __future__ import annotations

import ipaddress
import secrets
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path

from quail.config import EngineConfig
from quail.errors import ConfigError, UsageError
from quail.frontend.sql import Dialect
from quail.query_cli import TableArgument

DEFAULT_PORT = 8470
MAX_REQUEST_BYTES = 1 << 20
"""A statement and its options are small: a body over a mebibyte is refused before it is read whole."""
MAX_RESULT_BYTES = 256 << 20
SERVER_KEYS = ("host", "port", "token", "max_request_bytes", "max_result_bytes", "dialect")


@dataclass(frozen=True)
class ServerSettings:
    """`token` None means no token is asked for, which only a loopback address allows (`resolved`)."""

    config: EngineConfig
    tables: tuple[TableArgument, ...] = ()
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    token: str | None = None
    max_request_bytes: int = MAX_REQUEST_BYTES
    max_result_bytes: int = MAX_RESULT_BYTES
    dialect: Dialect = "snowflake"

    def __post_init__(self) -> None:
        if self.config.external_access:
            raise ConfigError("quail serve reads only the tables it registered: external_access cannot be turned "
                              "on (a client would name files on the server)")
        if not 0 <= self.port < 65536:
            raise ConfigError(f"port {self.port} is not a TCP port (0–65535; 0 picks a free one)")
        for name in ("max_request_bytes", "max_result_bytes"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")
        if self.token is not None and len(self.token) < 16:
            raise ConfigError("a token must be at least 16 characters (leave it out and one is generated)")
        if self.dialect not in ("snowflake", "bigquery"):
            raise ConfigError(f"dialect {self.dialect!r}: choose snowflake or bigquery")

    @property
    def loopback(self) -> bool:
        return is_loopback(self.host)

    def resolved(self) -> ServerSettings:
        """These settings with a token wherever one is needed: any address but loopback gets one, generated
        (and printed by the command) when none was given."""
        if self.token is not None or self.loopback:
            return self
        return _replace(self, token=secrets.token_urlsafe(24))


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _replace(settings: ServerSettings, **values: object) -> ServerSettings:
    current = {f.name: getattr(settings, f.name) for f in fields(settings)}
    return ServerSettings(**{**current, **values})  # type: ignore[arg-type]


@dataclass(frozen=True)
class FileSettings:
    """A config file's three sections: [server] (SERVER_KEYS), [engine] (EngineConfig's fields), [tables]."""

    server: dict[str, object]
    engine: dict[str, object]
    tables: tuple[str, ...]


def read_file(path: Path) -> FileSettings:
    """The TOML file's settings, every unknown section or key refused by name."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise UsageError(f"--config {path}: {error.strerror or error}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise UsageError(f"--config {path}: not a TOML file: {error}") from None
    unknown = sorted(set(data) - {"server", "engine", "tables"})
    if unknown:
        raise UsageError(f"--config {path}: unknown section(s) {', '.join(unknown)}; use [server], [engine], [tables]")
    server, engine, tables = (_section(path, data, name) for name in ("server", "engine", "tables"))
    engine_keys = {f.name for f in fields(EngineConfig)}
    for section, allowed in (("server", set(SERVER_KEYS)), ("engine", engine_keys)):
        extra = sorted(set(server if section == "server" else engine) - allowed)
        if extra:
            raise UsageError(f"--config {path}: unknown key(s) in [{section}]: {', '.join(extra)}; known: "
                             f"{', '.join(sorted(allowed))}")
    for name, value in tables.items():
        if not isinstance(value, str):
            raise UsageError(f"--config {path}: [tables] {name} must be a string 'path[:id_col]', got {value!r}")
    return FileSettings(server, engine, tuple(f"{name}={value}" for name, value in tables.items()))


def _section(path: Path, data: dict[str, object], name: str) -> dict[str, object]:
    section = data.get(name, {})
    if not isinstance(section, dict):
        raise UsageError(f"--config {path}: [{name}] must be a table of keys")
    return section
