"""The wire codec of a compute boundary: what the split providers added survives a round trip.

Known ports (earlier answers, a Scan restricted to a shard) keep their rows and schema metadata;
token columns travel by path or beside the message, and a transport that does not hand over what
the header says is an error; shard metrics come back whole.
"""

from __future__ import annotations

from dataclasses import replace

import pyarrow as pa
import pytest
from support.cases import CASE_BY_ID, keyword_session

from quail.backends import shapes
from quail.compute.request import ExecutionMetrics, PhysicalResponse, ShardMetrics
from quail.compute.wire import decode_request, decode_response, encode_request, encode_response, receive
from quail.runtime.coordinator import model_request


def round_trip(frames):
    parts = iter(bytes(frame) for frame in frames)
    return receive(parts.__next__)


@pytest.fixture(scope="module")
def sent():
    with keyword_session() as session:
        query = CASE_BY_ID["join_with_filters_on_both_sides"].query(session)
        graph = query.plan().graph
        request = model_request(session, graph, query.prepared())
        answers = shapes.filter_answers("a", [0, 2], [1, 1], [True, False], [0.5, -0.25])
        known = {("filter_a", "answers"): answers, ("scan_r", "rows"): pa.table({"r": pa.array([3, 4], pa.int32())})}
        yield replace(request, known=known)


def test_known_ports_keep_their_rows_and_shapes(sent):
    decoded = decode_request(round_trip(encode_request(sent)))
    assert decoded.known.keys() == sent.known.keys()
    for port, table in sent.known.items():
        assert decoded.known[port].equals(table)
        assert decoded.known[port].schema.metadata == table.schema.metadata
    assert decoded.graph == sent.graph and decoded.outputs == sent.outputs


def test_token_columns_travel_by_path_or_beside_the_message(sent):
    by_path = decode_request(round_trip(encode_request(sent)))
    beside = {alias: table.tokens.tokens for alias, table in sent.tables.items() if table.tokens is not None}
    carried = decode_request(round_trip(encode_request(sent, tokens="beside")), beside)
    for alias, table in sent.tables.items():
        if table.tokens is None:
            continue
        assert by_path.tables[alias].tokens.tokens.equals(table.tokens.tokens)
        assert carried.tables[alias].tokens.tokens.equals(table.tokens.tokens)
        assert carried.tables[alias].tokens.path == table.tokens.path, "the path still names the column"


def test_a_transport_that_does_not_hand_over_what_the_header_says_is_an_error(sent):
    with pytest.raises(ValueError, match="travel by beside, but the transport handed none"):
        decode_request(round_trip(encode_request(sent, tokens="beside")))
    with pytest.raises(ValueError, match="travel by path, but the transport handed columns"):
        decode_request(round_trip(encode_request(sent)), {})
    with pytest.raises(ValueError, match="carried no token column for alias"):
        decode_request(round_trip(encode_request(sent, tokens="beside")), {})


def test_shard_metrics_come_back_whole():
    shards = (ShardMetrics(1, 0, "r", "ray worker 0 (node 10.0.0.1, pid 7)", 12, 3456, 1.5, 0.25, "cold", 1),
              ShardMetrics(1, 1, "r", "ray worker 1", 11, 3400, None, cancelled=True))
    response = PhysicalResponse({}, ExecutionMetrics(2.0, 10, 0, 0.25, "cold", shards=shards))
    assert decode_response(round_trip(encode_response(response))).metrics.shards == shards
