"""The warehouses' spellings of embeddings, rewritten to the one form the general rule reads.

BigQuery: `AI.EMBED(content[, endpoint => 'm' | model => 'm'])` → `STRUCT<result, status>`, `AI.SIMILARITY(content1 =>
a, content2 => b, endpoint => 'm')` → FLOAT64. Snowflake: `AI_EMBED('model', text)` → a vector, `AI_SIMILARITY(a, b[,
{'model': 'm'}])` → FLOAT. Each embedding call becomes `AI_EMBED(text[, {'model': 'm'}])` (or `AI.EMBED(...)`, whose
value is BigQuery's STRUCT), and each similarity the cosine of two of them — DuckDB's `list_cosine_similarity` over
the vectors, so a similarity is two embeddings (each text embedded once, stored like every answer) and arithmetic.
"""

from __future__ import annotations

from sqlglot import exp

from quail.frontend.calls import MODEL_OPTION, struct_field
from quail.frontend.syntax import AiCall, ai_call, fail_at, safe_sql, unsupported

IGNORED = frozenset({"connection_id", "task_type"})
"""Named arguments that say how a warehouse's service runs the call (`task_type` picks a Vertex AI model's prompt;
Quail's embedding models take none): accepted, and nothing for Quail to do."""
REFUSED = {
    "title": "Quail embeds the content alone (a title changes only Vertex AI's document embeddings)",
    "model_params": "Quail's embedding models take no parameters",
    "output_dimensionality": "Quail's embedding models return their own number of dimensions",
}
COSINE = "LIST_COSINE_SIMILARITY"


def canonical_embeddings(statement: exp.Expression) -> exp.Expression:
    """`statement` with every similarity written as the cosine of two embeddings and every embedding call in the form
    `AI_EMBED(text[, {'model': 'm'}])` (the tree is changed in place)."""
    for node in [n for n in statement.walk() if _similarity_arguments(n) is not None]:
        node.replace(_cosine(node))
    for call in [c for c in (ai_call(n) for n in list(statement.walk())) if c is not None and c.kind == "embed"]:
        if not _is_canonical(call):
            call.node.replace(_respelled(call, *_embed_arguments(call)))
        elif len(call.arguments) == 2:
            _check_options(call, call.arguments[1])
    return statement


def _check_options(call: AiCall, options: exp.Expression) -> None:
    """An embedding call's options object holds a model and nothing else."""
    for entry in options.expressions:
        field = struct_field(entry)
        if field is None or field[0].lower() != MODEL_OPTION:
            raise unsupported(f"{call.spelling} option {safe_sql(entry)}", entry, "its one option is {'model': 'name'}")
        if not (isinstance(field[1], exp.Literal) and field[1].is_string):
            raise unsupported(f"{call.spelling} model {safe_sql(field[1])}", field[1], "name the model as a string")


def embedded_text(call: AiCall) -> exp.Expression:
    """What a canonical embedding call embeds."""
    if not call.arguments:
        raise fail_at(f"{call.spelling}() without the text to embed", call.node)
    return call.arguments[0]


# -- AI.EMBED / AI_EMBED --------------------------------------------------------------------------------------


def _is_canonical(call: AiCall) -> bool:
    arguments = call.arguments
    if any(isinstance(a, exp.Kwarg) for a in arguments):
        return False
    return len(arguments) == 1 or (len(arguments) == 2 and isinstance(arguments[1], exp.Struct))


def _embed_arguments(call: AiCall) -> tuple[exp.Expression, exp.Expression | None]:
    """(text, model) of an embedding call in its warehouse's form: Snowflake's `(model, text)`, BigQuery's
    `(content[, endpoint => m])`, either with `content =>` / `text =>` / `model =>` named."""
    named: dict[str, exp.Expression] = {}
    for argument in [a for a in call.arguments if isinstance(a, exp.Kwarg)]:
        name = argument.this.name.lower()
        if name in REFUSED:
            raise unsupported(f"{call.spelling}(..., {name} => ...)", argument, REFUSED[name])
        if name not in IGNORED:
            if name not in ("content", "text", "input", "model", "endpoint"):
                raise fail_at(f"{call.spelling} has no argument {name!r}", argument)
            named[name] = argument.expression
    positional = [a for a in call.arguments if not isinstance(a, exp.Kwarg)]
    if len(positional) > 2:
        raise unsupported(f"{call.spelling} with {len(call.arguments)} arguments", call.node,
                          "pass the model and the text (Snowflake) or the content and endpoint => (BigQuery)")
    model = named.get("model", named.get("endpoint"))
    if len(positional) == 2:
        model, text = positional
    else:
        text = named.get("content", named.get("text", named.get("input", positional[0] if positional else None)))
    if text is None:
        raise fail_at(f"{call.spelling} has no text to embed", call.node)
    return text, model


def _respelled(call: AiCall, text: exp.Expression, model: exp.Expression | None) -> exp.Expression:
    arguments = [text.copy()]
    if model is not None:
        if not (isinstance(model, exp.Literal) and model.is_string):
            raise unsupported(f"{call.spelling} model {safe_sql(model)}", model, "name the model as a string")
        arguments.append(exp.Struct(expressions=[exp.PropertyEQ(this=exp.to_identifier(MODEL_OPTION),
                                                                expression=model.copy())]))
    if call.spelling.startswith("AI."):
        return exp.Dot(this=exp.to_identifier("AI"), expression=exp.Anonymous(this="EMBED", expressions=arguments))
    return exp.Anonymous(this="AI_EMBED", expressions=arguments)


# -- AI.SIMILARITY / AI_SIMILARITY ----------------------------------------------------------------------------


def _similarity_arguments(node: exp.Expression) -> list[exp.Expression] | None:
    """The arguments of a similarity call at `node` (BigQuery's `AI.` dot included), or None for another node."""
    if isinstance(node, exp.Dot) and isinstance(node.this, exp.Identifier) and node.this.name.upper() == "AI":
        inner = node.expression
        if isinstance(inner, exp.AISimilarity) or (isinstance(inner, exp.Anonymous)
                                                   and str(inner.name).upper() == "SIMILARITY"):
            return list(inner.expressions)
        return None
    if isinstance(node, exp.AISimilarity) and not isinstance(node.parent, exp.Dot):
        return list(node.expressions)
    if isinstance(node, exp.Anonymous) and str(node.name).upper() == "AI_SIMILARITY":
        return list(node.expressions)
    return None


def _cosine(node: exp.Expression) -> exp.Expression:
    """The cosine similarity of the two texts' embeddings (a DOUBLE, NULL when either text is NULL)."""
    arguments = _similarity_arguments(node)
    assert arguments is not None
    spelling = "AI.SIMILARITY" if isinstance(node, exp.Dot) else "AI_SIMILARITY"
    named: dict[str, exp.Expression] = {}
    for argument in [a for a in arguments if isinstance(a, exp.Kwarg)]:
        name = argument.this.name.lower()
        if name in REFUSED:
            raise unsupported(f"{spelling}(..., {name} => ...)", argument, REFUSED[name])
        if name in IGNORED:
            continue
        if name not in ("content1", "content2", "model", "endpoint"):
            raise fail_at(f"{spelling} has no argument {name!r}", argument)
        named[name] = argument.expression
    positional = [a for a in arguments if not isinstance(a, exp.Kwarg)]
    first = named.get("content1", positional[0] if positional else None)
    second = named.get("content2", positional[1] if len(positional) > 1 else None)
    if first is None or second is None or len(positional) > 3:
        raise fail_at(f"{spelling} compares two texts: write {spelling}(a, b)", node)
    model = named.get("model", named.get("endpoint"))
    if len(positional) == 3:
        model = _config_model(positional[2], spelling)
    call = AiCall("embed", "AI_EMBED", (), node)
    embeddings = [_respelled(call, text, model) for text in (first, second)]
    return exp.cast(exp.Anonymous(this=COSINE, expressions=embeddings), "DOUBLE")


def _config_model(node: exp.Expression, spelling: str) -> exp.Expression | None:
    """Snowflake's config object `{'model': 'm'}`."""
    if not isinstance(node, exp.Struct):
        raise unsupported(f"{spelling} options {safe_sql(node)}", node, "write {'model': 'name'}")
    model = None
    for entry in node.expressions:
        field = struct_field(entry)
        if field is None or field[0].lower() != MODEL_OPTION:
            raise unsupported(f"{spelling} option {safe_sql(entry)}", entry, "its one option is {'model': 'name'}")
        model = field[1]
    return model
