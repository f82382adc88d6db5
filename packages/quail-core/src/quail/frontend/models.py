"""The models a statement's AI calls name, and the statement with those names resolved.

Every call may name its model: BigQuery's `endpoint => 'm'` (or `model =>`), Snowflake's `AI_COMPLETE('m', …)` and
`AI_EMBED('m', …)`. The warehouses' spellings (`forms`, `embedding_forms`) keep the name as the canonical call's
`model` option; the session resolves each against the catalog and the aliases its configuration declares
(`EngineConfig.model_aliases`), refusing a name it knows neither way, and writes back the catalog model's own name —
or drops the option when the call names the model it would answer with anyway — so the calls of one query block
that answer with one model read alike, and the planner of one block sees at once whether they do.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from sqlglot import exp

from quail.catalog.models import ModelKind
from quail.frontend.calls import MODEL_OPTION, struct_field
from quail.frontend.spec import Where
from quail.frontend.syntax import AiCall, ai_call, where_of


@dataclass(frozen=True)
class NamedModel:
    """A model a canonical call names, with the kind of model the call needs."""

    spelling: str
    name: str
    kind: ModelKind
    where: Where


def _named(call: AiCall) -> tuple[exp.Struct, exp.Expression, exp.Literal] | None:
    """The options object holding the call's `model` entry, that entry and the name it gives (a string); None when
    the call names no model."""
    for options in call.arguments[1:]:
        if not isinstance(options, exp.Struct):
            continue
        for entry in options.expressions:
            field = struct_field(entry)
            if field is not None and field[0].lower() == MODEL_OPTION:
                value = field[1]
                return (options, entry, value) if isinstance(value, exp.Literal) and value.is_string else None
    return None


def model_option(call: AiCall) -> str | None:
    """The model a canonical call names, or None for the one the session gives its kind of call."""
    found = _named(call)
    return None if found is None else str(found[2].this)


def named_models(statement: exp.Expression) -> tuple[NamedModel, ...]:
    """Every model the canonical calls of `statement` name, where it is named."""
    found = []
    for call in _calls(statement):
        named = _named(call)
        if named is not None:
            kind: ModelKind = "embedding" if call.kind == "embed" else "generative"
            found.append(NamedModel(call.spelling, str(named[2].this), kind, where_of(named[2])))
    return tuple(found)


def with_models(statement: exp.Expression, resolved: Mapping[tuple[str, ModelKind], str | None]) -> exp.Expression:
    """`statement` (changed in place) with each call's model written as `resolved` says: the catalog model's name,
    or no `model` entry at all (None: the model the session gives that kind of call)."""
    for call in _calls(statement):
        named = _named(call)
        if named is None:
            continue
        options, entry, name = named
        target = resolved[(str(name.this), "embedding" if call.kind == "embed" else "generative")]
        if target is None:
            entry.pop()
            if not options.expressions:
                options.pop()
        else:
            entry.set("this" if isinstance(entry, exp.Alias) else "expression", exp.Literal.string(target))
    return statement


def block_models(statement: exp.Expression) -> set[str | None]:
    """The generative models the AI calls in `statement` answer with (None: the session's)."""
    return {model_option(call) for call in _calls(statement) if call.kind != "embed"}


def _calls(statement: exp.Expression) -> list[AiCall]:
    return [c for c in (ai_call(n) for n in statement.walk()) if c is not None]
