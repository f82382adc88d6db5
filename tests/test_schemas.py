"""Output schemas: the JSON Schema written for the grammar reads back as the same schema, every value of a schema
round-trips through JSON into its Arrow column, and no text — however wrong — makes reading it fail."""

from __future__ import annotations

import json

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from quail.schemas import (
    INT_BOUND,
    STATUS,
    SchemaField,
    SchemaType,
    answer_type,
    from_json_schema,
    json_schema,
    parse_answer,
)

scalars = st.sampled_from(["string", "int", "double", "bool"]).map(SchemaType)


def _structs(inner: st.SearchStrategy[SchemaType]) -> st.SearchStrategy[SchemaType]:
    fields = st.lists(st.tuples(st.text("abcdefgh_", min_size=1, max_size=5), inner), min_size=1, max_size=3,
                      unique_by=lambda f: f[0])
    return fields.map(lambda found: SchemaType("struct", fields=tuple(SchemaField(n, t) for n, t in found)))


types = st.recursive(scalars, lambda inner: st.builds(SchemaType, st.just("list"), inner) | _structs(inner),
                     max_leaves=6)
schemas = _structs(types)


@st.composite
def value_of(draw: st.DrawFn, schema: SchemaType) -> object:
    if schema.kind == "struct":
        return {f.name: draw(value_of(f.type)) for f in schema.fields}
    if schema.kind == "list":
        assert schema.item is not None
        return draw(st.lists(value_of(schema.item), max_size=3))
    return draw({"string": st.text(max_size=8), "int": st.integers(-INT_BOUND, INT_BOUND),
                 "double": st.floats(allow_nan=False, allow_infinity=False), "bool": st.booleans()}[schema.kind])


@settings(max_examples=150, deadline=None)
@given(schemas)
def test_the_grammars_json_schema_reads_back_as_the_same_schema(schema):
    assert from_json_schema(json.loads(json.dumps(json_schema(schema)))) == schema


@settings(max_examples=150, deadline=None)
@given(st.data(), schemas)
def test_every_value_round_trips_through_json_into_its_arrow_column(data, schema):
    value = data.draw(value_of(schema))
    answer = parse_answer(json.dumps(value), schema)
    assert answer == {**value, STATUS: ""}
    column = pa.array([answer, None], answer_type(schema))
    assert column.to_pylist()[0] == answer


@settings(max_examples=200, deadline=None)
@given(schemas, st.text(max_size=40) | st.from_regex(r'\{"[a-h]{1,3}": ?[0-9tfn"\[\]{}.,-]{0,12}\}?'))
def test_no_text_fails_the_read_it_gives_null_fields_and_a_reason(schema, text):
    answer = parse_answer(text, schema)
    if answer[STATUS]:
        assert all(answer[f.name] is None for f in schema.fields)
        assert answer[STATUS].startswith("the output did not parse as the schema")
    pa.array([answer], answer_type(schema))  # whatever came back fits the column
