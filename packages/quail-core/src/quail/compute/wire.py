"""The wire format of a compute boundary: requests, responses, progress and errors as bytes.

A message is a JSON header frame followed by binary frames: Arrow IPC streams for tables (answer
tables keep their schema metadata, so their shapes survive), plans through the physical-plan codecs,
specs and metrics as codec-encoded frozen dataclasses. Token columns travel as the path of their
memory-mapped file (a worker on the same machine maps it, zero-copy), or — for workers on other
machines — beside the message, as the transport carries them (`tokens="beside"`): nothing crosses
as a live Python object.
"""

from __future__ import annotations

import json
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypeVar

import pyarrow as pa

from quail.catalog.devices import DeviceSpec
from quail.catalog.models import ModelSpec
from quail.compute.request import (
    ExecutionMetrics,
    NodeMetrics,
    PhysicalRequest,
    PhysicalResponse,
    PortRef,
    ShardMetrics,
    TableInput,
)
from quail.config import EngineConfig
from quail.data.tokens import TokenColumn
from quail.errors import CompileError, ComputeError, QuailError, Refusal, RefusalError
from quail.physical.codecs import Json, decode_graph, encode_graph, from_json, register_codec_type, to_json

for _cls in (EngineConfig, ModelSpec, DeviceSpec, NodeMetrics, ShardMetrics, Refusal):
    register_codec_type(_cls)

T = TypeVar("T")
Frames = list[bytes | memoryview]
MessageKind = Literal["request", "response", "progress", "error"]
TokenTravel = Literal["path", "beside"]
"""How a request's token columns travel: as their file's path, or beside the message (the transport's)."""


@dataclass(frozen=True)
class Message:
    """A decoded header and the binary frames that followed it."""

    kind: MessageKind
    header: dict[str, Json]
    blobs: tuple[bytes, ...]


def message(kind: MessageKind, header: Mapping[str, Json], blobs: Sequence[bytes | memoryview] = ()) -> Frames:
    head = json.dumps({"kind": kind, "frames": len(blobs), **header}).encode()
    return [head, *blobs]


def receive(read: Callable[[], bytes]) -> Message:
    """One message from a frame reader (e.g. a Connection's recv_bytes)."""
    header = json.loads(read())
    blobs = tuple(read() for _ in range(int(header.pop("frames"))))
    kind = header.pop("kind")
    return Message(kind, header, blobs)


# -- tables -----------------------------------------------------------------------------------------


def table_bytes(table: pa.Table) -> memoryview:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return memoryview(sink.getvalue())


def table_of(data: bytes) -> pa.Table:
    return pa.ipc.open_stream(pa.py_buffer(data)).read_all()


# -- requests ---------------------------------------------------------------------------------------


def encode_request(request: PhysicalRequest, tokens: TokenTravel = "path") -> Frames:
    """The request as frames; with `tokens="beside"` the header names each token column's file (its
    identity) and the transport must hand the columns to `decode_request` itself."""
    blobs: list[bytes | memoryview] = []
    tables: list[Json] = []
    for alias, table in request.tables.items():
        blobs.append(table_bytes(table.keys))
        entry: dict[str, Json] = {"alias": alias, "num_rows": table.num_rows, "keys": len(blobs) - 1,
                                  "tokens": None if table.tokens is None else str(table.tokens.path),
                                  "truncated_to": None if table.tokens is None else table.tokens.truncated_to,
                                  "left_out": None}
        if table.left_out is not None:
            blobs.append(table_bytes(pa.table({"row": table.left_out})))
            entry["left_out"] = len(blobs) - 1
        tables.append(entry)
    header: dict[str, Json] = {
        "backend": request.backend, "graph": encode_graph(request.graph),
        "outputs": [list(port) for port in request.outputs], "tables": tables, "tokens": tokens,
        "known": _port_tables(request.known, blobs),
        "config": to_json(request.config), "model": to_json(request.model), "device": to_json(request.device),
    }
    return message("request", header, blobs)


def decode_request(received: Message, beside: Mapping[str, pa.ChunkedArray] | None = None) -> PhysicalRequest:
    """`beside`: alias → its token lists as the transport delivered them, for `tokens="beside"` requests."""
    header = received.header
    travel = header["tokens"]
    if (travel == "beside") != (beside is not None):
        raise ValueError(f"the request's token columns travel by {travel}, but the transport "
                         f"{'handed columns' if beside is not None else 'handed none'}")
    tables = {}
    for entry in _list(header["tables"]):
        item = _dict(entry)
        alias = str(item["alias"])
        path, truncated_to, left_out = item["tokens"], item["truncated_to"], item["left_out"]
        tokens = None if path is None else _token_column(alias, Path(str(path)), beside)
        if tokens is not None and truncated_to is not None:
            tokens = tokens.truncated(int(_number(truncated_to)))
        keys = table_of(received.blobs[int(_number(item["keys"]))])
        left = None if left_out is None else table_of(received.blobs[int(_number(left_out))]).column("row")
        tables[alias] = TableInput(alias, int(_number(item["num_rows"])), tokens, keys,
                                   None if left is None else left.combine_chunks())
    outputs = tuple((str(node), str(port)) for node, port in (_list(o) for o in _list(header["outputs"])))
    return PhysicalRequest(
        backend=str(header["backend"]), graph=decode_graph(str(header["graph"])), outputs=outputs, tables=tables,
        config=_typed(header["config"], EngineConfig), model=_typed(header["model"], ModelSpec),
        device=_typed(header["device"], DeviceSpec), known=_tables_of(header["known"], received.blobs),
    )


def _token_column(alias: str, path: Path, beside: Mapping[str, pa.ChunkedArray] | None) -> TokenColumn:
    """The mapped file at `path`, or the lists the transport carried (`path` then only names the column)."""
    if beside is None:
        return TokenColumn.open(path)
    found = beside.get(alias)
    if found is None:
        raise ValueError(f"the transport carried no token column for alias {alias!r} (it carried {sorted(beside)})")
    return TokenColumn(path, found)


def _port_tables(tables: Mapping[PortRef, pa.Table], blobs: list[bytes | memoryview]) -> list[Json]:
    """[node, port, blob index] per table, appending each table's IPC bytes to `blobs`."""
    entries: list[Json] = []
    for (node, port), table in tables.items():
        blobs.append(table_bytes(table))
        entries.append([node, port, len(blobs) - 1])
    return entries


def _tables_of(entries: Json, blobs: Sequence[bytes]) -> dict[PortRef, pa.Table]:
    tables = {}
    for entry in _list(entries):
        node, port, index = _list(entry)
        tables[(str(node), str(port))] = table_of(blobs[int(_number(index))])
    return tables


# -- responses --------------------------------------------------------------------------------------


def encode_response(response: PhysicalResponse) -> Frames:
    blobs: list[bytes | memoryview] = []
    metrics = response.metrics
    header: dict[str, Json] = {
        "tables": _port_tables(response.tables, blobs),
        "metrics": {
            "wall_s": metrics.wall_s, "fresh_tokens": metrics.fresh_tokens, "cached_tokens": metrics.cached_tokens,
            "boot_s": metrics.boot_s, "boot_kind": metrics.boot_kind,
            "nodes": [[node, to_json(value)] for node, value in metrics.nodes.items()],
            "notes": list(metrics.notes),
            "extra": dict(metrics.extra), "shards": to_json(metrics.shards),
        },
    }
    return message("response", header, blobs)


def decode_response(received: Message) -> PhysicalResponse:
    tables = _tables_of(received.header["tables"], received.blobs)
    raw = _dict(received.header["metrics"])
    nodes = {str(node): _typed(value, NodeMetrics) for node, value in (_list(n) for n in _list(raw["nodes"]))}
    boot_kind = raw["boot_kind"]
    metrics = ExecutionMetrics(
        wall_s=_number(raw["wall_s"]), fresh_tokens=_optional_int(raw["fresh_tokens"]),
        cached_tokens=_optional_int(raw["cached_tokens"]),
        boot_s=None if raw["boot_s"] is None else _number(raw["boot_s"]),
        boot_kind="cold" if boot_kind == "cold" else "warm" if boot_kind == "warm" else None,
        nodes=nodes, notes=tuple(str(note) for note in _list(raw["notes"])),
        extra={str(k): _number(v) for k, v in _dict(raw["extra"]).items()},
        shards=tuple(_typed(shard, ShardMetrics) for shard in _list(raw["shards"])),
    )
    return PhysicalResponse(tables, metrics)


# -- progress and errors ----------------------------------------------------------------------------


def encode_progress(node: str, done: int, total: int) -> Frames:
    return message("progress", {"node": node, "done": done, "total": total})


def encode_error(error: BaseException) -> Frames:
    """An exception as data: refusals and compile errors keep their values, others their type and traceback."""
    header: dict[str, Json] = {
        "type": type(error).__name__, "message": str(error),
        "traceback": "".join(traceback.format_exception(error)),
        "refusal": to_json(error.refusal) if isinstance(error, RefusalError) else None,
        "line": error.line if isinstance(error, CompileError) else None,
        "column": error.column if isinstance(error, CompileError) else None,
        "detail": error.detail if isinstance(error, CompileError) else None,
    }
    return message("error", header)


def decode_error(received: Message, where: str) -> QuailError:
    """The exception to raise at the caller for an error message from `where` (a worker's description)."""
    header = received.header
    if header["refusal"] is not None:
        return RefusalError(_typed(header["refusal"], Refusal))
    if header["detail"] is not None:
        return CompileError(str(header["detail"]), line=_optional_int(header["line"]),
                            column=_optional_int(header["column"]))
    return ComputeError(f"{where} failed: {header['type']}: {header['message']}", str(header["traceback"]))


# -- typed reading of JSON --------------------------------------------------------------------------


def _typed(data: Json, cls: type[T]) -> T:
    value = from_json(data)
    if not isinstance(value, cls):
        raise ValueError(f"expected a {cls.__name__} on the wire, got {type(value).__name__}")
    return value


def _list(data: Json) -> list[Json]:
    if not isinstance(data, list):
        raise ValueError(f"expected a list on the wire, got {type(data).__name__}")
    return data


def _dict(data: Json) -> dict[str, Json]:
    if not isinstance(data, dict):
        raise ValueError(f"expected an object on the wire, got {type(data).__name__}")
    return data


def _number(data: Json) -> float:
    if not isinstance(data, int | float) or isinstance(data, bool):
        raise ValueError(f"expected a number on the wire, got {data!r}")
    return float(data)


def _optional_int(data: Json) -> int | None:
    return None if data is None else int(_number(data))
