"""Output schemas of structured generation: one description, read four ways.

A schema (BigQuery's `output_schema => 'actor STRING, year INT64'`, `AI.GENERATE_INT`'s `result`, Snowflake's
`response_format` and `AI_EXTRACT`'s fields) is a `SchemaType`. The decoder is held to its JSON Schema
(`json_schema`, compiled by the grammar library on the backend); the prompt names its fields (`describe`); the
answer column has its Arrow type (`arrow_type`, plus a `status` field); and the generated text is read back into
that type (`parse_value`) — or the row gets NULL fields and a status saying why, never an error.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import pyarrow as pa

Kind = Literal["string", "int", "double", "bool", "list", "struct"]
STATUS = "status"
"""The field of a structured answer column that is '' for a row whose output parsed, else why it did not."""


@dataclass(frozen=True)
class SchemaField:
    name: str
    type: SchemaType
    description: str | None = None


@dataclass(frozen=True)
class SchemaType:
    kind: Kind
    item: SchemaType | None = None
    """A list's element type."""
    fields: tuple[SchemaField, ...] = ()
    """A struct's fields, in order."""

    def __post_init__(self) -> None:
        if (self.kind == "list") != (self.item is not None):
            raise ValueError("a list type, and only a list type, has an element type")
        if self.kind == "struct" and not self.fields:
            raise ValueError("a struct type has at least one field")
        names = [f.name for f in self.fields]
        if len(set(names)) != len(names):
            raise ValueError(f"a struct's field names must differ: {names}")


def struct(fields: Mapping[str, SchemaType]) -> SchemaType:
    return SchemaType("struct", fields=tuple(SchemaField(name, kind) for name, kind in fields.items()))


INT_BOUND = 10 ** 18 - 1
"""The largest integer a structured generation may write: 18 digits fit INT64."""
JSON_TYPES = {"string": "string", "int": "integer", "double": "number", "bool": "boolean"}


def json_schema(schema: SchemaType) -> dict[str, object]:
    """The JSON Schema the decoder is held to: every field required, nothing else allowed."""
    if schema.kind == "list":
        assert schema.item is not None
        return {"type": "array", "items": json_schema(schema.item)}
    if schema.kind == "struct":
        properties: dict[str, object] = {}
        for field in schema.fields:
            entry = json_schema(field.type)
            if field.description:
                entry = {**entry, "description": field.description}
            properties[field.name] = entry
        return {"type": "object", "properties": properties, "required": [f.name for f in schema.fields],
                "additionalProperties": False}
    if schema.kind == "int":  # an INT64 column holds it: the grammar bounds its digits (18; llguidance cannot
        return {"type": "integer", "minimum": -INT_BOUND, "maximum": INT_BOUND}  # write int64's own range)
    return {"type": JSON_TYPES[schema.kind]}


ARROW_TYPES = {"string": pa.string(), "int": pa.int64(), "double": pa.float64(), "bool": pa.bool_()}


def arrow_type(schema: SchemaType) -> pa.DataType:
    if schema.kind == "list":
        assert schema.item is not None
        return pa.list_(arrow_type(schema.item))
    if schema.kind == "struct":
        return pa.struct([(f.name, arrow_type(f.type)) for f in schema.fields])
    return ARROW_TYPES[schema.kind]


def answer_type(schema: SchemaType) -> pa.DataType:
    """The answer column of a structured generation (a struct schema): its fields and `status`."""
    return pa.struct([*((f.name, arrow_type(f.type)) for f in schema.fields), (STATUS, pa.string())])


def describe(schema: SchemaType) -> str:
    """The fields as the prompt names them: `actor (text), year (integer): the year it came out`."""
    return ", ".join(f"{f.name} ({_word(f.type)})" + (f": {f.description}" if f.description else "")
                     for f in schema.fields)


def _word(schema: SchemaType) -> str:
    if schema.kind == "list":
        assert schema.item is not None
        return f"list of {_word(schema.item)}"
    if schema.kind == "struct":
        return "object with " + ", ".join(f"{f.name} ({_word(f.type)})" for f in schema.fields)
    return {"string": "text", "int": "integer", "double": "number", "bool": "true or false"}[schema.kind]


def parse_answer(text: str, schema: SchemaType) -> dict[str, object]:
    """A structured answer row (a struct schema): the fields read from the generated JSON and status '', or NULL
    fields and the reason the text did not parse."""
    try:
        values = parse_value(json.loads(text), schema)
    except ValueError as error:  # json.JSONDecodeError is a ValueError
        return {**{f.name: None for f in schema.fields}, STATUS: f"the output did not parse as the schema: {error}"}
    assert isinstance(values, dict)
    return {**values, STATUS: ""}


def parse_value(value: object, schema: SchemaType) -> object:
    """`value` (parsed JSON) as `schema`'s Python value; ValueError naming what does not fit."""
    if schema.kind == "struct":
        if not isinstance(value, dict):
            raise ValueError(f"expected an object, got {json.dumps(value)[:40]}")
        missing = [f.name for f in schema.fields if f.name not in value]
        if missing:
            raise ValueError(f"missing field {missing[0]!r}")
        return {f.name: parse_value(value[f.name], f.type) for f in schema.fields}
    if schema.kind == "list":
        if not isinstance(value, list):
            raise ValueError(f"expected a list, got {json.dumps(value)[:40]}")
        assert schema.item is not None
        return [parse_value(v, schema.item) for v in value]
    if schema.kind == "bool":
        if isinstance(value, bool):
            return value
    elif schema.kind == "int":
        if isinstance(value, int) and not isinstance(value, bool) and -(2 ** 63) <= value < 2 ** 63:
            return value
    elif schema.kind == "double":
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            return float(value)
    elif isinstance(value, str):
        return value
    raise ValueError(f"expected {_word(schema)}, got {json.dumps(value)[:40]}")


SCHEMA_KINDS: dict[str, Kind] = {"string": "string", "integer": "int", "number": "double", "boolean": "bool"}
MAX_DEPTH = 8


def from_json_schema(document: object, depth: int = 0) -> SchemaType:
    """The JSON Schema subset a structured generation takes — objects (`properties`; every property is asked
    for), arrays (`items`), string, integer, number, boolean, each with an optional `description` — or ValueError
    naming what is not in it."""
    if depth > MAX_DEPTH:
        raise ValueError(f"the schema nests deeper than {MAX_DEPTH} levels")
    if not isinstance(document, dict):
        raise ValueError(f"a schema is a JSON object, got {json.dumps(document)[:40]}")
    kind = document.get("type")
    if kind == "object":
        properties = document.get("properties")
        if not isinstance(properties, dict) or not properties:
            raise ValueError("an object schema names its fields in a non-empty 'properties'")
        fields = []
        for name, entry in properties.items():
            if not isinstance(name, str) or not name:
                raise ValueError(f"field name {name!r} is not a name")
            description = entry.get("description") if isinstance(entry, dict) else None
            fields.append(SchemaField(name, from_json_schema(entry, depth + 1),
                                      description if isinstance(description, str) else None))
        return SchemaType("struct", fields=tuple(fields))
    if kind == "array":
        return SchemaType("list", item=from_json_schema(document.get("items"), depth + 1))
    if isinstance(kind, str) and kind in SCHEMA_KINDS:
        return SchemaType(SCHEMA_KINDS[kind])
    raise ValueError(f"type {json.dumps(kind)} is not one of object, array, string, integer, number, boolean")
