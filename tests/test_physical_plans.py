"""Physical plans: codec round trips, graph validation, and user edits of non-model nodes."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, fields, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import quail
from quail import PlanEditError
from quail.logical.expressions import (
    AiPredicate,
    ColumnRef,
    Equality,
    Label,
    OutputColumn,
    PairCondition,
    Prompt,
    ScoreThreshold,
)
from quail.physical import nodes as ph
from quail.physical.codecs import decode_graph, encode_graph, from_json, register_codec_type, to_json
from quail.physical.editing import insert, move, remove
from quail.physical.graph import Edge, PhysicalGraph
from quail.prompts import AnswerTokens
from quail.schemas import SchemaField, SchemaType

# ------------------------------------------------------------------------------------------------
# Random values of every field type
# ------------------------------------------------------------------------------------------------

texts = st.text(max_size=6)
floats = st.floats(allow_nan=False, allow_infinity=False)
token_ids = st.lists(st.integers(0, 300_000), max_size=6).map(tuple)
column_refs = st.builds(ColumnRef, texts, texts)
prompts = st.builds(Prompt, texts, st.lists(column_refs, max_size=2).map(tuple))
thresholds = st.builds(ScoreThreshold, st.sampled_from([">=", ">", "<=", "<"]), floats)
predicates = st.builds(AiPredicate, prompts, st.integers(-5, 10_000), st.none() | st.floats(0, 1),
                       st.none() | texts, st.none() | thresholds)
labels = st.builds(Label, texts, st.none() | texts)
equalities = st.builds(Equality, column_refs, column_refs)
outputs = st.builds(OutputColumn, texts, st.none() | column_refs)
estimates = st.builds(ph.NodeEstimate, st.none() | floats, st.none() | floats, st.none() | floats)
stages = st.builds(ph.FilterStage, predicates, token_ids, floats, st.booleans())
semantics = st.sampled_from(["full", "exists", "anti", "left"])
answer_tokens = st.none() | st.builds(AnswerTokens, token_ids, token_ids)
scalar_types = st.sampled_from(["string", "int", "double", "bool"]).map(SchemaType)
schema_types = st.recursive(scalar_types, lambda inner: st.builds(SchemaType, st.just("list"), inner), max_leaves=3)
schemas = st.lists(st.tuples(st.text(min_size=1, max_size=4), schema_types, st.none() | texts), min_size=1,
                   max_size=3, unique_by=lambda f: f[0]).map(
    lambda fields: SchemaType("struct", fields=tuple(SchemaField(*f) for f in fields)))


def tuples_of(strategy: st.SearchStrategy) -> st.SearchStrategy:
    return st.lists(strategy, max_size=2).map(tuple)


pair_conditions = st.builds(PairCondition, st.text(max_size=20), tuples_of(column_refs))


FIELDS: dict[type, dict[str, st.SearchStrategy]] = {
    ph.Scan: {"table": texts, "alias": texts, "where": texts},
    ph.AiFilter: {"alias": texts, "column": column_refs, "preamble": token_ids, "frame": token_ids,
                  "stages": tuples_of(stages), "retain_kv": st.booleans(), "retain_all": st.booleans(),
                  "share_prefixes": st.booleans(), "calibration": tuples_of(token_ids), "answers": answer_tokens},
    ph.AiJoin: {"predicate": predicates, "anchor": column_refs, "partners": tuples_of(column_refs),
                "semantics": semantics, "preamble": token_ids, "frame": token_ids, "labels": tuples_of(token_ids),
                "cue": token_ids, "selectivity": floats, "assumed_selectivity": st.booleans(),
                "retain_anchor_kv": st.booleans(), "share_prefixes": st.booleans(),
                "calibration": tuples_of(token_ids), "answers": answer_tokens},
    ph.AiClassify: {"alias": texts, "column": column_refs, "output": texts, "position": st.integers(0, 99),
                    "labels": tuples_of(labels), "preamble": token_ids, "tail": token_ids,
                    "label_tokens": tuples_of(token_ids), "retain_kv": st.booleans()},
    ph.AiScore: {"alias": texts, "column": column_refs, "output": texts, "position": st.integers(0, 99),
                 "prompt": prompts, "preamble": token_ids, "question": token_ids, "answers": answer_tokens,
                 "retain_kv": st.booleans()},
    ph.AiGenerate: {"alias": texts, "column": column_refs, "output": texts, "position": st.integers(0, 99),
                    "prompt": prompts, "preamble": token_ids, "tail": token_ids, "max_tokens": st.integers(1, 8192),
                    "stop": token_ids, "schema": st.none() | schemas, "retain_kv": st.booleans()},
    ph.AiEmbed: {"alias": texts, "column": column_refs, "output": texts, "preamble": token_ids,
                 "dimensions": st.integers(1, 4096), "context": st.integers(1, 8192),
                 "special_tokens": st.integers(0, 4)},
    ph.HashJoin: {"equalities": tuples_of(equalities), "conditions": tuples_of(pair_conditions)},
    ph.RecombineFilter: {"alias": texts},
    ph.RecombineJoin: {"semantics": semantics},
    ph.RecombineLabels: {"alias": texts, "output": texts, "allowed": st.none() | tuples_of(texts)},
    ph.RecombineScores: {"alias": texts, "output": texts},
    ph.RecombineTexts: {"alias": texts, "output": texts, "schema": st.none() | schemas},
    ph.RecombineVerdicts: {"alias": texts, "output": texts},
    ph.RecombineEmbeddings: {"alias": texts, "output": texts},
    ph.DropNullDocuments: {"aliases": tuples_of(texts), "distinct": st.booleans()},
    ph.Project: {"columns": tuples_of(outputs), "statement": texts, "relations": tuples_of(texts)},
    ph.Limit: {"count": st.integers(0, 10**12)},
    ph.Barrier: {},
}


def test_the_field_strategies_cover_every_core_node_type_and_field():
    assert set(FIELDS) == set(ph.CORE_NODE_TYPES)
    for cls, strategies in FIELDS.items():
        declared = {f.name for f in fields(cls)} - {"id", "estimate"}
        assert declared == set(strategies), cls.__name__


NODES = {cls: st.builds(cls, st.just("n"), estimates, **strategies) for cls, strategies in FIELDS.items()}


@st.composite
def physical_graphs(draw: st.DrawFn) -> PhysicalGraph:
    """One node of every core type plus random extra ones, random edges between them, a random root."""
    extra = draw(st.lists(st.sampled_from(ph.CORE_NODE_TYPES), max_size=3))
    kinds = draw(st.permutations([*ph.CORE_NODE_TYPES, *extra]))
    ids = draw(st.lists(st.text(min_size=1, max_size=8), min_size=len(kinds), max_size=len(kinds), unique=True))
    nodes = tuple(replace(draw(NODES[cls]), id=node_id) for cls, node_id in zip(kinds, ids, strict=True))
    ports = st.sampled_from(["rows", "answers", "left", "right", "candidates", "table"]) | texts
    edges = draw(st.lists(st.builds(Edge, st.sampled_from(ids), ports, st.sampled_from(ids), ports), max_size=8))
    return PhysicalGraph(nodes, tuple(edges), draw(st.sampled_from(ids) | texts))


# ------------------------------------------------------------------------------------------------
# Codecs
# ------------------------------------------------------------------------------------------------


@settings(max_examples=120, deadline=None)
@given(physical_graphs())
def test_encode_then_decode_gives_an_equal_graph_and_the_same_json(graph):
    text = encode_graph(graph)
    decoded = decode_graph(text)
    assert decoded == graph
    assert [type(n) for n in decoded.nodes] == [type(n) for n in graph.nodes]
    # Estimates do not take part in node equality: compare them on their own.
    assert [n.estimate for n in decoded.nodes] == [n.estimate for n in graph.nodes]
    assert encode_graph(decoded) == text
    assert json.loads(text) == to_json(graph)


@settings(max_examples=100, deadline=None)
@given(st.one_of(*NODES.values()))
def test_every_core_node_round_trips_on_its_own(node):
    back = from_json(json.loads(json.dumps(to_json(node))))
    assert back == node and type(back) is type(node) and back.estimate == node.estimate


def test_decoded_sequences_are_tuples_not_lists():
    graph = simple_graph()
    decoded = decode_graph(encode_graph(graph))
    assert isinstance(decoded.nodes, tuple) and isinstance(decoded.edges, tuple)
    stage = decoded.node("filter_r").stages[0]
    assert isinstance(stage.question, tuple) and isinstance(stage.predicate.prompt.columns, tuple)


def test_a_valid_plan_still_validates_after_a_round_trip():
    graph = joined_graph()
    decoded = decode_graph(encode_graph(graph))
    decoded.validate()
    assert decoded == graph


def test_decoding_rejects_unknown_types_and_non_plans():
    with pytest.raises(ValueError, match="unknown plan value type"):
        decode_graph(json.dumps({"__type__": "NoSuchNode", "id": "x"}))
    with pytest.raises(ValueError, match="unknown plan value type"):
        decode_graph(json.dumps({"id": "x"}))
    with pytest.raises(ValueError, match="does not hold a physical plan"):
        decode_graph(json.dumps(to_json(Edge("a", "rows", "b", "rows"))))
    with pytest.raises(ValueError, match="does not hold a physical plan"):
        decode_graph("[1, 2]")


@dataclass(frozen=True)
class NotRegistered:
    value: int = 0


def test_encoding_refuses_unregistered_values():
    with pytest.raises(TypeError, match="not a registered codec type"):
        to_json(NotRegistered())
    with pytest.raises(TypeError, match="cannot encode"):
        to_json({"a": 1})
    with pytest.raises(TypeError, match="not a dataclass"):
        register_codec_type(int)


@dataclass(frozen=True)
class RequestExecutionForTest(ph.PhysicalNode):
    """A backend-owned node, as a backend would register one."""

    endpoint: str = ""
    batch: int = 0

    INPUTS = ph._ports(rows=ph.PortType.ROWS)
    OUTPUTS = ph._ports(rows=ph.PortType.ROWS)


def test_a_registered_backend_node_round_trips():
    register_codec_type(RequestExecutionForTest)
    register_codec_type(RequestExecutionForTest)  # registering the same class twice is harmless
    graph = insert(simple_graph(), RequestExecutionForTest("remote", endpoint="http://x", batch=8), after="scan_r")
    assert decode_graph(encode_graph(graph)) == graph

    with pytest.raises(ValueError, match="already named"):
        register_codec_type(_another_class_with_the_same_name())


def _another_class_with_the_same_name() -> type:
    @dataclass(frozen=True)
    class RequestExecutionForTest(ph.PhysicalNode):
        pass

    return RequestExecutionForTest


# ------------------------------------------------------------------------------------------------
# Hand-built plans
# ------------------------------------------------------------------------------------------------

R_BODY = ColumnRef("r", "body")
M_TITLE = ColumnRef("m", "title")
FILTER_PREDICATE = AiPredicate(Prompt("Is {0} positive?", (R_BODY,)), 1, selectivity=0.3)
JOIN_PREDICATE = AiPredicate(Prompt("Is {0} about {1}?", (R_BODY, M_TITLE)), 2)


def scan_r() -> ph.Scan:
    return ph.Scan("scan_r", table="reviews", alias="r")


def filter_r() -> ph.AiFilter:
    stage = ph.FilterStage(FILTER_PREDICATE, (7, 8, 9), 0.3, False)
    return ph.AiFilter("filter_r", ph.NodeEstimate(rows=3.0, seconds=0.5), alias="r", column=R_BODY,
                       preamble=(1, 2), frame=(3,), stages=(stage,), retain_kv=True)


def simple_graph() -> PhysicalGraph:
    """Scan → AiFilter → RecombineFilter → Limit → Project."""
    nodes = (
        scan_r(),
        filter_r(),
        ph.RecombineFilter("survivors_r", alias="r"),
        ph.Limit("limit", count=10),
        ph.Project("project", columns=(OutputColumn("r.body", R_BODY),),
                   statement='SELECT r."body" AS "r.body" FROM __quail_rows_0 AS r', relations=("r",)),
    )
    edges = (
        Edge("scan_r", "rows", "filter_r", "rows"),
        Edge("scan_r", "rows", "survivors_r", "rows"),
        Edge("filter_r", "answers", "survivors_r", "answers"),
        Edge("survivors_r", "rows", "limit", "rows"),
        Edge("limit", "rows", "project", "rows"),
    )
    return PhysicalGraph(nodes, edges, "project")


def joined_graph() -> PhysicalGraph:
    """Filtered r ⋈ m through an AI join with equality candidates, then classify, score, barrier, limit."""
    nodes = (
        scan_r(),
        ph.Scan("scan_m", table="movies", alias="m"),
        filter_r(),
        ph.RecombineFilter("survivors_r", alias="r"),
        ph.HashJoin("candidates_2", equalities=(Equality(ColumnRef("r", "movie_id"), ColumnRef("m", "id")),)),
        ph.AiJoin("join_2", predicate=JOIN_PREDICATE, anchor=R_BODY, partners=(M_TITLE,), preamble=(1,),
                  frame=(4, 5), labels=((6,),), cue=(9,)),
        ph.RecombineJoin("joined_2", semantics="full"),
        ph.AiClassify("classify_genre", alias="m", column=M_TITLE, output="genre", position=3,
                      labels=(Label("drama"), Label("comedy", "funny")), preamble=(1,), tail=(2,),
                      label_tokens=((11,), (12, 13))),
        ph.RecombineLabels("labels_genre", alias="m", output="genre", allowed=("drama",)),
        ph.AiScore("score_s", alias="r", column=R_BODY, output="s", position=4,
                   prompt=Prompt("How good is {0}?", (R_BODY,)), preamble=(1,), question=(2, 3)),
        ph.RecombineScores("scores_s", alias="r", output="s"),
        ph.Barrier("barrier"),
        ph.Limit("limit", count=5),
        ph.Project("project", columns=(OutputColumn("r.body", R_BODY), OutputColumn("genre")),
                   statement='SELECT r."body" AS "r.body", __quail."genre" AS genre FROM __quail_rows_0 AS r '
                             "POSITIONAL JOIN __quail_rows_1 AS m POSITIONAL JOIN __quail AS __quail",
                   relations=("r", "m")),
    )
    edges = (
        Edge("scan_r", "rows", "filter_r", "rows"),
        Edge("scan_r", "rows", "survivors_r", "rows"),
        Edge("filter_r", "answers", "survivors_r", "answers"),
        Edge("survivors_r", "rows", "candidates_2", "left"),
        Edge("scan_m", "rows", "candidates_2", "right"),
        Edge("survivors_r", "rows", "join_2", "left"),
        Edge("scan_m", "rows", "join_2", "right"),
        Edge("candidates_2", "rows", "join_2", "candidates"),
        Edge("survivors_r", "rows", "joined_2", "left"),
        Edge("scan_m", "rows", "joined_2", "right"),
        Edge("join_2", "answers", "joined_2", "answers"),
        Edge("joined_2", "rows", "classify_genre", "rows"),
        Edge("joined_2", "rows", "labels_genre", "rows"),
        Edge("classify_genre", "answers", "labels_genre", "answers"),
        Edge("labels_genre", "rows", "score_s", "rows"),
        Edge("labels_genre", "rows", "scores_s", "rows"),
        Edge("score_s", "answers", "scores_s", "answers"),
        Edge("scores_s", "rows", "barrier", "rows"),
        Edge("barrier", "rows", "limit", "rows"),
        Edge("limit", "rows", "project", "rows"),
    )
    return PhysicalGraph(nodes, edges, "project")


def with_edges(graph: PhysicalGraph, drop: tuple[Edge, ...] = (), add: tuple[Edge, ...] = (),
               nodes: tuple[ph.PhysicalNode, ...] = (), root: str | None = None) -> PhysicalGraph:
    kept = tuple(e for e in graph.edges if e not in drop)
    return PhysicalGraph((*graph.nodes, *nodes), (*kept, *add), graph.root if root is None else root)


# ------------------------------------------------------------------------------------------------
# Validation
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("build", [simple_graph, joined_graph])
def test_hand_built_plans_validate_and_order_every_input_before_its_consumer(build):
    graph = build()
    graph.validate()
    order = [n.id for n in graph.topological_order()]
    assert sorted(order) == sorted(n.id for n in graph.nodes)
    for edge in graph.edges:
        assert order.index(edge.source) < order.index(edge.target)


def test_an_ai_join_without_candidates_is_valid():
    graph = joined_graph()
    without = PhysicalGraph(tuple(n for n in graph.nodes if n.id != "candidates_2"),
                            tuple(e for e in graph.edges if "candidates_2" not in (e.source, e.target)), "project")
    without.validate()


def test_plan_edit_error_is_exported_from_quail():
    assert quail.PlanEditError is PlanEditError
    assert issubclass(PlanEditError, quail.QuailError)


def test_a_type_mismatch_on_an_edge_is_refused():
    graph = with_edges(simple_graph(), drop=(Edge("survivors_r", "rows", "limit", "rows"),),
                       add=(Edge("filter_r", "answers", "limit", "rows"),))
    with pytest.raises(PlanEditError, match=re.escape("produces filter_answers but limit.rows takes rows")):
        graph.validate()


def test_answers_of_the_wrong_kind_are_refused():
    graph = joined_graph()
    bad = with_edges(graph, drop=(Edge("classify_genre", "answers", "labels_genre", "answers"),),
                     add=(Edge("score_s", "answers", "labels_genre", "answers"),))
    with pytest.raises(PlanEditError, match=re.escape("produces scores but labels_genre.answers takes labels")):
        bad.validate()


def test_an_unconnected_required_input_is_refused():
    graph = with_edges(simple_graph(), drop=(Edge("filter_r", "answers", "survivors_r", "answers"),))
    with pytest.raises(PlanEditError, match=re.escape("survivors_r.answers is not connected")):
        graph.validate()


def test_an_input_fed_twice_is_refused():
    graph = with_edges(simple_graph(), add=(Edge("scan_r", "rows", "limit", "rows"),))
    with pytest.raises(PlanEditError, match=re.escape("limit.rows is fed twice")):
        graph.validate()


def test_a_cycle_is_refused():
    loop = (ph.Barrier("b1"), ph.Barrier("b2"))
    graph = with_edges(simple_graph(), nodes=loop,
                       add=(Edge("b1", "rows", "b2", "rows"), Edge("b2", "rows", "b1", "rows")))
    with pytest.raises(PlanEditError, match="cycle through b1, b2"):
        graph.validate()


def test_a_cycle_through_the_main_path_is_refused():
    graph = with_edges(simple_graph(), nodes=(ph.Barrier("back"),),
                       drop=(Edge("scan_r", "rows", "filter_r", "rows"),),
                       add=(Edge("survivors_r", "rows", "back", "rows"), Edge("back", "rows", "filter_r", "rows")))
    with pytest.raises(PlanEditError, match="cycle"):
        graph.validate()


def test_a_duplicate_node_id_is_refused():
    graph = with_edges(simple_graph(), nodes=(ph.Barrier("limit"),))
    with pytest.raises(PlanEditError, match="share the id 'limit'"):
        graph.validate()


def test_a_missing_root_is_refused():
    with pytest.raises(PlanEditError, match="root 'nowhere' is not a node"):
        with_edges(simple_graph(), root="nowhere").validate()


@pytest.mark.parametrize("root", ["limit", "scan_r", "survivors_r", "filter_r"])
def test_a_root_that_is_not_a_project_is_refused(root):
    graph = simple_graph()
    with pytest.raises(PlanEditError, match="must output a table"):
        PhysicalGraph(graph.nodes, graph.edges, root).validate()


def test_unknown_ports_are_refused():
    out = with_edges(simple_graph(), drop=(Edge("limit", "rows", "project", "rows"),),
                     add=(Edge("limit", "rowz", "project", "rows"),))
    with pytest.raises(PlanEditError, match="no output port 'rowz'"):
        out.validate()
    into = with_edges(simple_graph(), add=(Edge("scan_r", "rows", "limit", "extra"),))
    with pytest.raises(PlanEditError, match="no input port 'extra'"):
        into.validate()


def test_an_edge_naming_a_missing_node_is_refused():
    graph = with_edges(simple_graph(), add=(Edge("ghost", "rows", "limit", "rows"),))
    with pytest.raises(PlanEditError):
        graph.validate()


# ------------------------------------------------------------------------------------------------
# Editing
# ------------------------------------------------------------------------------------------------


def edge_set(graph: PhysicalGraph) -> set[Edge]:
    return set(graph.edges)


def test_insert_a_barrier_after_a_node_puts_it_on_its_outgoing_edge():
    graph = simple_graph()
    edited = insert(graph, ph.Barrier("wait"), after="survivors_r")
    edited.validate()
    old = Edge("survivors_r", "rows", "limit", "rows")
    assert edge_set(edited) == (edge_set(graph) - {old}) | {
        Edge("survivors_r", "rows", "wait", "rows"), Edge("wait", "rows", "limit", "rows")}
    assert [n.id for n in edited.nodes] == [*(n.id for n in graph.nodes), "wait"]
    assert edited.root == graph.root


def test_insert_after_a_node_with_several_consumers_rewires_all_of_them():
    graph = simple_graph()
    edited = insert(graph, ph.Limit("first_100", count=100), after="scan_r")
    leaving = {e for e in graph.edges if e.source == "scan_r"}
    assert edge_set(edited) == (edge_set(graph) - leaving) | {Edge("scan_r", "rows", "first_100", "rows")} | {
        Edge("first_100", "rows", e.target, e.target_port) for e in leaving}
    edited.validate()


def test_insert_into_a_self_join_feeds_both_sides():
    graph = joined_graph()
    edited = insert(graph, ph.Barrier("wait_m"), after="scan_m")
    assert {(e.target, e.target_port) for e in edited.consumers_of("wait_m")} == {
        ("candidates_2", "right"), ("join_2", "right"), ("joined_2", "right")}
    assert edited.consumers_of("scan_m") == [Edge("scan_m", "rows", "wait_m", "rows")]


def test_remove_takes_a_node_out_and_reconnects_its_input():
    graph = simple_graph()
    edited = remove(graph, "limit")
    edited.validate()
    assert edge_set(edited) == (edge_set(graph) - {Edge("survivors_r", "rows", "limit", "rows"),
                                                   Edge("limit", "rows", "project", "rows")}) | {
        Edge("survivors_r", "rows", "project", "rows")}
    assert "limit" not in {n.id for n in edited.nodes}


def test_insert_then_remove_gives_back_the_same_plan():
    graph = joined_graph()
    for after in ("scan_r", "scan_m", "survivors_r", "candidates_2", "joined_2", "labels_genre", "limit"):
        edited = remove(insert(graph, ph.Barrier("extra"), after=after), "extra")
        assert edge_set(edited) == edge_set(graph)
        assert edited.nodes == graph.nodes


def test_move_a_limit_after_another_node():
    graph = simple_graph()
    edited = move(graph, "limit", after="scan_r")
    edited.validate()
    assert edge_set(edited) == {
        Edge("scan_r", "rows", "limit", "rows"),
        Edge("limit", "rows", "filter_r", "rows"),
        Edge("limit", "rows", "survivors_r", "rows"),
        Edge("filter_r", "answers", "survivors_r", "answers"),
        Edge("survivors_r", "rows", "project", "rows"),
    }
    assert edited.node("limit") == graph.node("limit")


def test_move_a_barrier_in_the_joined_plan():
    graph = joined_graph()
    edited = move(graph, "barrier", after="survivors_r")
    edited.validate()
    assert edited.inputs_of("barrier")["rows"] == Edge("survivors_r", "rows", "barrier", "rows")
    assert edited.inputs_of("limit")["rows"] == Edge("scores_s", "rows", "limit", "rows")
    assert {(e.target, e.target_port) for e in edited.consumers_of("barrier")} == {
        ("candidates_2", "left"), ("join_2", "left"), ("joined_2", "left")}


MODEL_NODE_IDS = ("filter_r", "join_2", "classify_genre", "score_s")


@pytest.mark.parametrize("node_id", MODEL_NODE_IDS)
def test_removing_or_moving_a_model_node_is_refused(node_id):
    graph = joined_graph()
    assert graph.node(node_id).is_model_node
    with pytest.raises(PlanEditError, match="model node"):
        remove(graph, node_id)
    with pytest.raises(PlanEditError, match="model node"):
        move(graph, node_id, after="scan_r")


@pytest.mark.parametrize("node_id", ["filter_r", "join_2", "classify_genre", "score_s"])
def test_inserting_a_model_node_is_refused(node_id):
    model_node = replace(joined_graph().node(node_id), id="new_model_node")
    with pytest.raises(PlanEditError, match="model node"):
        insert(simple_graph(), model_node, after="scan_r")


@pytest.mark.parametrize("node", [ph.HashJoin("hj", equalities=()), ph.RecombineFilter("rf", alias="r"),
                                  ph.Project("p2", columns=(), statement="SELECT 1", relations=()),
                                  ph.Scan("s2", table="reviews", alias="r")])
def test_inserting_a_node_that_is_not_pass_through_is_refused(node):
    with pytest.raises(PlanEditError, match=r"pass-through|changes rows into table"):
        insert(simple_graph(), node, after="scan_r")


@pytest.mark.parametrize("node_id", ["survivors_r", "project", "scan_r"])
def test_removing_a_node_that_is_not_pass_through_is_refused(node_id):
    with pytest.raises(PlanEditError):
        remove(simple_graph(), node_id)


def test_inserting_with_a_duplicate_id_is_refused():
    with pytest.raises(PlanEditError, match="already in the plan"):
        insert(simple_graph(), ph.Barrier("limit"), after="scan_r")
    with pytest.raises(PlanEditError, match="already in the plan"):
        insert(simple_graph(), ph.Limit("scan_r", count=1), after="survivors_r")


def test_inserting_after_the_root_is_refused():
    with pytest.raises(PlanEditError, match="feeds nothing"):
        insert(simple_graph(), ph.Barrier("wait"), after="project")


def test_inserting_a_rows_node_on_an_answers_edge_is_refused():
    with pytest.raises(PlanEditError, match=re.escape("filter_r.answers produces filter_answers but wait.rows")):
        insert(simple_graph(), ph.Barrier("wait"), after="filter_r")


def test_moving_a_node_after_itself_is_refused():
    with pytest.raises(PlanEditError, match="after itself"):
        move(simple_graph(), "limit", after="limit")


def test_edits_leave_the_original_plan_unchanged():
    graph = simple_graph()
    before = encode_graph(graph)
    insert(graph, ph.Barrier("wait"), after="scan_r")
    remove(graph, "limit")
    move(graph, "limit", after="scan_r")
    assert encode_graph(graph) == before


@pytest.mark.parametrize("edit", ["insert", "remove", "move"])
def test_editing_a_node_that_is_not_in_the_plan_is_refused(edit):
    graph = simple_graph()
    with pytest.raises(PlanEditError):
        if edit == "insert":
            insert(graph, ph.Barrier("wait"), after="ghost")
        elif edit == "remove":
            remove(graph, "ghost")
        else:
            move(graph, "ghost", after="scan_r")


# ------------------------------------------------------------------------------------------------
# Random edit sequences
# ------------------------------------------------------------------------------------------------

PASS_THROUGH = (ph.Barrier, ph.Limit)


def contracted(graph: PhysicalGraph) -> set[Edge]:
    """The plan's edges with every Barrier and Limit spliced out: what edits must never change."""
    skip = {n.id for n in graph.nodes if isinstance(n, PASS_THROUGH)}

    def origin(edge: Edge) -> tuple[str, str]:
        while edge.source in skip:
            edge = graph.inputs_of(edge.source)["rows"]
        return edge.source, edge.source_port

    return {Edge(*origin(e), e.target, e.target_port) for e in graph.edges if e.target not in skip}


edit_steps = st.lists(st.tuples(st.sampled_from(["insert", "remove", "move"]), st.integers(0, 10_000),
                                st.integers(0, 10_000), st.booleans()), min_size=1, max_size=8)


@settings(max_examples=100, deadline=None)
@given(st.sampled_from([simple_graph, joined_graph]), edit_steps)
def test_random_edit_sequences_keep_a_valid_plan_and_every_other_edge(build, steps):
    graph = build()
    base = contracted(graph)
    models = {n.id: n for n in graph.nodes if n.is_model_node}
    counter = 0
    for action, i, j, barrier in steps:
        non_root = [n.id for n in graph.nodes if n.OUTPUTS.get("rows") is ph.PortType.ROWS]
        movable = [n.id for n in graph.nodes if isinstance(n, PASS_THROUGH)]
        if action == "insert":
            counter += 1
            node = ph.Barrier(f"b{counter}") if barrier else ph.Limit(f"l{counter}", count=j)
            graph = insert(graph, node, after=non_root[i % len(non_root)])
        elif action == "remove" and movable:
            graph = remove(graph, movable[i % len(movable)])
        elif action == "move" and movable:
            node_id = movable[i % len(movable)]
            targets = [n for n in non_root if n != node_id]
            graph = move(graph, node_id, after=targets[j % len(targets)])
        graph.validate()
        assert contracted(graph) == base
        assert {n.id: n for n in graph.nodes if n.is_model_node} == models
        assert decode_graph(encode_graph(graph)) == graph
