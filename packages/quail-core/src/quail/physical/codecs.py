"""JSON codecs for physical plans, so a plan can cross a process boundary and come back equal.

Values are frozen dataclasses made of primitives, tuples and other registered dataclasses; each
dataclass is written as an object tagged with its type name. Backends that add node types
register them with `register_codec_type`.
"""

from __future__ import annotations

import dataclasses
import json
from typing import TypeAlias

from quail.logical.expressions import (
    AiPredicate,
    ColumnRef,
    Equality,
    Example,
    Label,
    OutputColumn,
    PairCondition,
    Prompt,
    ScoreThreshold,
)
from quail.physical.graph import Edge, PhysicalGraph
from quail.physical.nodes import CORE_NODE_TYPES, FilterStage, NodeEstimate
from quail.prompts import AnswerTokens
from quail.schemas import SchemaField, SchemaType

Json: TypeAlias = bool | int | float | str | list["Json"] | dict[str, "Json"] | None
TAG = "__type__"

_TYPES: dict[str, type] = {}


def register_codec_type(cls: type) -> type:
    """Make a frozen dataclass (a backend's own node type, say) encodable; returns it unchanged."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls.__name__} is not a dataclass")
    known = _TYPES.get(cls.__name__)
    if known is not None and known is not cls:
        raise ValueError(f"another codec type is already named {cls.__name__!r}")
    _TYPES[cls.__name__] = cls
    return cls


for _cls in (*CORE_NODE_TYPES, AnswerTokens, AiPredicate, ColumnRef, Equality, Example, Label, OutputColumn,
             PairCondition, Prompt, ScoreThreshold, FilterStage, NodeEstimate, Edge, PhysicalGraph, SchemaType,
             SchemaField):
    register_codec_type(_cls)


def to_json(value: object) -> Json:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, tuple | list):
        return [to_json(v) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        name = type(value).__name__
        if _TYPES.get(name) is not type(value):
            raise TypeError(f"{name} is not a registered codec type")
        encoded: dict[str, Json] = {TAG: name}
        for item in dataclasses.fields(value):
            encoded[item.name] = to_json(getattr(value, item.name))
        return encoded
    raise TypeError(f"cannot encode {type(value).__name__} in a physical plan")


def from_json(data: Json) -> object:
    if isinstance(data, list):
        return tuple(from_json(v) for v in data)
    if isinstance(data, dict):
        name = data.get(TAG)
        if not isinstance(name, str) or name not in _TYPES:
            raise ValueError(f"unknown plan value type {name!r}")
        values = {k: from_json(v) for k, v in data.items() if k != TAG}
        return _TYPES[name](**values)
    return data


def encode_graph(graph: PhysicalGraph) -> str:
    return json.dumps(to_json(graph), sort_keys=True)


def decode_graph(text: str) -> PhysicalGraph:
    graph = from_json(json.loads(text))
    if not isinstance(graph, PhysicalGraph):
        raise ValueError("the JSON does not hold a physical plan")
    return graph
