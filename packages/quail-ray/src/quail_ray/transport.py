"""Requests and answers through Ray's object store, as the wire codec's frames and Arrow tables.

A message is `quail.compute.wire`'s: a JSON header frame and Arrow IPC blobs. Blobs travel as
`pyarrow.Buffer`s, which Ray serializes out of band, so a worker on the coordinator's node reads them
from shared memory without a copy. Token columns travel beside the request (`tokens="beside"`) as
Arrow tables in the object store: an alias that a phase does not split is put once per query and
read by every worker (a join's partners are broadcast once); the alias a phase splits travels per
shard holding only that shard's documents — its other rows are empty lists, which the shard's
restricted Scan never reaches.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, cast

import pyarrow as pa
import pyarrow.compute as pc

from quail.extend import (
    TOKENS_SCHEMA,
    Frames,
    Message,
    Phase,
    PhysicalRequest,
    Shard,
    TokenColumn,
    encode_request,
    receive,
)

if TYPE_CHECKING:
    from ray import ObjectRef

RayFrames = list[bytes | pa.Buffer]
"""A message as Ray carries it: the header as bytes, every blob as a pyarrow Buffer (out of band)."""
Beside = dict[str, "ObjectRef[pa.Table]"]
"""alias → its token table in the object store, for one shard's request."""


def to_ray(frames: Frames) -> RayFrames:
    """Frames for Ray: no copy of the blobs (a Buffer wraps the IPC bytes where they are)."""
    header, *blobs = frames
    return [bytes(header), *(pa.py_buffer(blob) for blob in blobs)]


def from_ray(frames: Sequence[bytes | pa.Buffer]) -> Message:
    """The message in frames that Ray delivered; its Arrow tables point into the delivered buffers."""
    parts = iter(frames)
    return receive(cast(Callable[[], bytes], parts.__next__))  # Buffers stand in for bytes: both are buffers


def request_frames(request: PhysicalRequest) -> RayFrames:
    return to_ray(encode_request(request, tokens="beside"))


def token_table(column: TokenColumn | pa.ListArray | pa.ChunkedArray) -> pa.Table:
    tokens = column.tokens if isinstance(column, TokenColumn) else column
    return pa.Table.from_arrays([tokens], schema=TOKENS_SCHEMA)


def shard_tokens(column: TokenColumn, shard: Shard) -> pa.ListArray:
    """The column with every row outside the shard emptied: row positions keep their meaning, only the
    shard's tokens travel."""
    count = len(column)
    inside = pc.is_in(pa.array(range(count), pa.int32()), value_set=shard.rows())
    lengths = pc.if_else(inside, column.lengths(), pa.scalar(0, pa.int32()))
    offsets = pa.concat_arrays([pa.array([0], pa.int32()), pc.cumulative_sum(lengths).cast(pa.int32())])
    pieces = [pc.list_flatten(column.tokens.slice(start, stop - start)) for start, stop in shard.ranges]
    chunks = [chunk for piece in pieces for chunk in piece.chunks]
    values = pa.concat_arrays(chunks) if chunks else pa.array([], pa.int32())
    return pa.ListArray.from_arrays(offsets, values.cast(pa.int32()))


class TokenShipment:
    """The object-store copies of one query's token columns: whole ones put once, split ones per shard."""

    def __init__(self, request: PhysicalRequest, put: Callable[[pa.Table], ObjectRef[pa.Table]]) -> None:
        self.columns = {alias: table.tokens for alias, table in request.tables.items() if table.tokens is not None}
        self._put = put
        self._whole: dict[str, ObjectRef[pa.Table]] = {}
        self._shards: dict[tuple[str, int], ObjectRef[pa.Table]] = {}

    def beside(self, phase: Phase, shard: Shard) -> Beside:
        """alias → token table for one shard of `phase`."""
        refs: Beside = {}
        for alias, column in self.columns.items():
            if alias == phase.alias:
                key = (alias, shard.index)
                if key not in self._shards:
                    self._shards[key] = self._put(token_table(shard_tokens(column, shard)))
                refs[alias] = self._shards[key]
            else:
                if alias not in self._whole:
                    self._whole[alias] = self._put(token_table(column))
                refs[alias] = self._whole[alias]
        return refs

