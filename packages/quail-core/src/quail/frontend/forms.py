"""The warehouses' own spellings of an AI call, rewritten to the one form the reader reads.

BigQuery writes a prompt as a tuple (`AI.IF(('Is music discussed? ', f.body))`) or a string, and names its
arguments (`input =>`, `categories =>`, `connection_id =>`); Snowflake concatenates (`AI_FILTER('Is it
positive? ' || r.body)`, `AI_FILTER(CONCAT('…', r.body))`) or passes a column. Each becomes `PROMPT(template,
arguments...)` — the literal parts make the template, every other part a placeholder `{i}` — with
positional arguments, so both dialects and every spelling compile to the same plan as `PROMPT(...)`.
Options Quail has no use for are accepted and dropped; those it cannot honour are refused by name.
"""

from __future__ import annotations

import json

from sqlglot import exp

from quail.frontend.calls import MODEL_OPTION, read_labels, struct_field
from quail.frontend.embedding_forms import canonical_embeddings
from quail.frontend.syntax import (
    AiCall,
    ai_call,
    fail_at,
    refuse_other_ai_functions,
    safe_sql,
    unsupported,
)
from quail.schemas import Kind, SchemaField, SchemaType, from_json_schema, json_schema, struct

IGNORED = frozenset({"connection_id", "max_error_ratio", "optimization_mode"})
"""Named arguments of the warehouses that say how their service runs the call: nothing for Quail to do."""
PROMPT_NAMES = frozenset({"prompt", "input"})
MODEL_NAMES = frozenset({"endpoint", "model"})
"""Named arguments naming the model a call answers with: kept as the canonical call's `model` option."""
REFUSED = {
    "model_params": "a judgement is one next-token readout: no temperature or output length applies",
    "output_schema": "AI.IF / AI.SCORE / AI.CLASSIFY return a fixed type",
}


GENERATED = "generated_"
"""The column AI.GENERATE_TABLE's rewrite holds each row's STRUCT in, before spreading its fields."""
TABLE_PARAMETERS = {"output_schema": "output_schema", "max_output_tokens": "max_tokens", "temperature": "temperature",
                    "top_p": "top_p", "top_k": "top_k"}


def _is_generate_table(node: exp.Expression) -> bool:
    return isinstance(node, exp.Table) and isinstance(node.this, exp.GenerateTable)


def _generated_table(node: exp.Table) -> exp.Expression:
    """BigQuery's `AI.GENERATE_TABLE(MODEL m, (SELECT … AS prompt …), STRUCT('a STRING, …' AS output_schema, …))`
    as the table it returns: the input query's columns, then the schema's fields, `full_response` and `status` —
    an AI.GENERATE over the input's `prompt` column in a derived table, its STRUCT spread into columns."""
    function = node.this
    query = function.args.get("expression")
    if not isinstance(query, exp.Subquery | exp.Select):
        raise unsupported("AI.GENERATE_TABLE without an input query", node, "pass (SELECT … AS prompt FROM …)")
    parameters = function.args.get("params_struct")
    options: dict[str, exp.Expression] = {}
    for entry in parameters.expressions if isinstance(parameters, exp.Struct) else ():
        field = struct_field(entry)
        if field is None or field[0].lower() not in TABLE_PARAMETERS:
            raise unsupported(f"AI.GENERATE_TABLE parameter {safe_sql(entry)}", entry,
                              f"its parameters here: {', '.join(TABLE_PARAMETERS)}")
        options[field[0].lower()] = field[1]
    if "output_schema" not in options:
        raise fail_at("AI.GENERATE_TABLE needs STRUCT('name TYPE, …' AS output_schema)", node)
    schema = _schema_of(AiCall("generate", "AI.GENERATE_TABLE", (), node), options["output_schema"])
    assert schema is not None
    inner = query.this if isinstance(query, exp.Subquery) else query
    source = exp.Subquery(this=inner.copy(), alias=exp.TableAlias(this=exp.to_identifier("q")))
    parameters_out = [exp.PropertyEQ(this=exp.to_identifier(TABLE_PARAMETERS[key]), expression=value.copy())
                      for key, value in options.items() if key != "output_schema"]
    parameters_out.append(exp.PropertyEQ(this=exp.to_identifier("output_schema"),
                                         expression=exp.Literal.string(json.dumps(json_schema(schema)))))
    prompt = exp.Anonymous(this="PROMPT", expressions=[exp.Literal.string("{0}"), exp.column("prompt", table="q")])
    call = exp.Dot(this=exp.to_identifier("AI"), expression=exp.Anonymous(
        this="GENERATE", expressions=[prompt, exp.Struct(expressions=parameters_out)]))
    generating = exp.select(exp.column(exp.Star(), table="q"), exp.alias_(call, GENERATED)).from_(source)
    spread = [exp.alias_(exp.Dot(this=exp.column(GENERATED, table="g"), expression=exp.to_identifier(f.name,
                                                                                                      quoted=True)),
                         exp.to_identifier(f.name, quoted=True)) for f in schema.fields]
    spread += [exp.alias_(exp.Dot(this=exp.column(GENERATED, table="g"), expression=exp.to_identifier(name)), name)
               for name in ("full_response", "status")]
    everything = exp.Star(except_=[exp.column(GENERATED)])
    outer = exp.select(exp.column(everything, table="g"), *spread).from_(
        exp.Subquery(this=generating, alias=exp.TableAlias(this=exp.to_identifier("g"))))
    return exp.Subquery(this=outer, alias=exp.TableAlias(this=exp.to_identifier(node.alias or "generated")))


SENTIMENTS = ("positive", "negative", "neutral", "mixed", "unknown")
"""Snowflake AI_SENTIMENT's labels."""


def _is_sentiment(node: exp.Expression) -> bool:
    return isinstance(node, exp.Anonymous) and str(node.name).upper() == "AI_SENTIMENT"


def _sentiment(node: exp.Anonymous) -> exp.Expression:
    """Snowflake's AI_SENTIMENT(text[, categories]) as the object it returns — `{categories: [{name: 'overall',
    sentiment: …}, {name: category, sentiment: …}, …]}` — each sentiment an AI_CLASSIFY of the text into
    SENTIMENTS, so it is planned, batched and stored as classification is."""
    arguments = list(node.expressions)
    if not 1 <= len(arguments) <= 2 or any(isinstance(a, exp.Kwarg) for a in arguments):
        raise unsupported("AI_SENTIMENT with these arguments", node, "write AI_SENTIMENT(text[, ['category', ...]])")
    categories: list[str] = []
    if len(arguments) == 2:
        listed = arguments[1]
        if not isinstance(listed, exp.Array) or not all(_is_text(c) and str(c.this).strip()
                                                         for c in listed.expressions):
            raise unsupported(f"AI_SENTIMENT categories {safe_sql(listed)}", listed, "write ['cost', 'service']")
        categories = [str(c.this) for c in listed.expressions]
        if any("{" in c or "}" in c for c in categories):
            raise fail_at("AI_SENTIMENT categories may not have braces", listed)
    labels = exp.Array(expressions=[exp.Literal.string(label) for label in SENTIMENTS])
    entries = []
    for name in ["overall", *categories]:
        about = "overall" if name == "overall" else f"about {name}"
        question = exp.Tuple(expressions=[exp.Literal.string(f"What is the sentiment {about} of "), arguments[0].copy(),
                                          exp.Literal.string("?")])
        prompt = _as_prompt(question, AiCall("classify", "AI_SENTIMENT", (question,), node))
        classified = exp.Anonymous(this="AI_CLASSIFY", expressions=[prompt, labels.copy()])
        entries.append(exp.Struct(expressions=[
            exp.PropertyEQ(this=exp.to_identifier("name"), expression=exp.Literal.string(name)),
            exp.PropertyEQ(this=exp.to_identifier("sentiment"), expression=classified)]))
    return exp.Struct(expressions=[exp.PropertyEQ(this=exp.to_identifier("categories"),
                                                  expression=exp.Array(expressions=entries))])


def _structured(node: exp.Expression) -> bool:
    """An AI call whose value is an object (a structured generation, AI_EXTRACT, AI_SENTIMENT's rewrite)."""
    call = ai_call(node)
    return (call is not None and call.kind == "generate") or (
        isinstance(node, exp.Struct) and any(ai_call(n) is not None for n in node.walk()))


def _field_path(node: exp.JSONExtract) -> exp.Expression:
    """Snowflake's `value:field[0].inner` over an AI call's object as field and element access (the index stays
    0-based, as the statement's dialect counts; DuckDB's SQL is written 1-based from it): the path reads the
    object's own typed fields, not a JSON text of them."""
    value = node.this
    path = node.expression
    for part in path.expressions if isinstance(path, exp.JSONPath) else ():
        if isinstance(part, exp.JSONPathRoot):
            continue
        if isinstance(part, exp.JSONPathKey):
            value = exp.Dot(this=value, expression=exp.to_identifier(str(part.this), quoted=True))
        elif isinstance(part, exp.JSONPathSubscript) and isinstance(part.this, int):
            value = exp.Bracket(this=value, expressions=[exp.Literal.number(part.this)])
        else:
            raise unsupported(f"the path {safe_sql(path)}", node, "read fields by name and elements by number")
    return value


def _reads_classification(node: exp.Expression) -> bool:
    """A path read from AI_CLASSIFY's value as Snowflake's object: `AI_CLASSIFY(…):labels…`, `AI_CLASSIFY(…)['…']`."""
    keyed = isinstance(node, exp.Bracket) and len(node.expressions) == 1 and \
        isinstance(node.expressions[0], exp.Literal) and node.expressions[0].is_string
    if isinstance(node, exp.Bracket) and not keyed:
        return False
    call = ai_call(node.this) if isinstance(node, exp.JSONExtract | exp.Bracket) else None
    return call is not None and call.kind == "classify"


def _labels(node: exp.JSONExtract | exp.Bracket) -> exp.Expression:
    """The object's `labels` as Snowflake returns them — an array holding the chosen label, NULL where the call is
    NULL — and then at most one element of it (`[0]`, 0-based as the dialect counts). The call itself keeps its
    value, the label, everywhere else."""
    if isinstance(node, exp.Bracket):
        keys: list[object] = [node.expressions[0].this]
        rest: list[exp.Expression] = []
        outer = node.parent
        indexed = isinstance(outer, exp.Bracket) and outer.this is node
        if indexed and isinstance(outer.parent, exp.Bracket | exp.JSONExtract | exp.Dot) and outer.parent.this is outer:
            keys = [None]  # a path past the label itself
    else:
        parts = [p for p in node.expression.expressions if not isinstance(p, exp.JSONPathRoot)] \
            if isinstance(node.expression, exp.JSONPath) else []
        keys = [str(parts[0].this)] if parts and isinstance(parts[0], exp.JSONPathKey) else [None]
        rest = parts[1:]
    if keys != ["labels"] or len(rest) > 1 or not all(
            isinstance(p, exp.JSONPathSubscript) and isinstance(p.this, int) for p in rest):
        raise unsupported(f"{safe_sql(node)}", node, "AI_CLASSIFY's object has one field, labels, an array of one "
                          "label: read AI_CLASSIFY(…):labels, :labels[0] or ['labels'][0] (the call alone is the "
                          "label)")
    call = node.this
    found = ai_call(call)
    assert found is not None
    labels: exp.Expression = _each_label(found) if _multi_label(found) else exp.Case(
        ifs=[exp.If(this=exp.Is(this=call.copy(), expression=exp.Null()), true=exp.Null())],
        default=exp.Array(expressions=[call.copy()]))
    for part in rest:
        labels = exp.Bracket(this=exp.Paren(this=labels), expressions=[exp.Literal.number(part.this)])
    return labels


OUTPUT_MODES = ("single", "multi")


def _multi_label(call: AiCall) -> bool:
    """Whether an AI_CLASSIFY asks for every label that applies (Snowflake's `{'output_mode': 'multi'}`, BigQuery's
    `output_mode => 'multi'`) rather than the one that fits best."""
    if call.kind != "classify":
        return False
    mode = _classify_options(call).get("output_mode")
    if mode is None:
        return False
    if not (_is_text(mode) and str(mode.this).lower() in OUTPUT_MODES):
        raise fail_at(f"{call.spelling} output_mode {safe_sql(mode)}: write 'single' or 'multi'", mode)
    return str(mode.this).lower() == "multi"


def _classify_options(call: AiCall) -> dict[str, exp.Expression]:
    """AI_CLASSIFY's config entries: the options object after the labels, and BigQuery's named arguments."""
    found = {a.this.name.lower(): a.expression for a in call.arguments if isinstance(a, exp.Kwarg)}
    positional = [a for a in call.arguments if not isinstance(a, exp.Kwarg)]
    if len(positional) > 2 and isinstance(positional[2], exp.Struct):
        for entry in positional[2].expressions:
            field = struct_field(entry)
            if field is not None:
                found.setdefault(field[0].lower(), field[1])
    return found


def _each_label(call: AiCall) -> exp.Expression:
    """A multi-label AI_CLASSIFY as the labels whose yes/no question holds, in the order written: one AI_FILTER per
    label (`Does it belong to the category "x"?` after the input), so every label is a judgement of its own over
    the document's KV (`FLATTEN` of one-label lists: NULL where the input is NULL)."""
    positional = [a for a in call.arguments if not isinstance(a, exp.Kwarg)]
    named = {a.this.name.lower(): a.expression for a in call.arguments if isinstance(a, exp.Kwarg)}
    first = named.get("input", positional[0] if positional else None)
    categories = named.get("categories", positional[1] if len(positional) > 1 else None)
    if first is None or categories is None:
        raise fail_at(f"{call.spelling} takes the input and the labels", call.node)
    options = _classify_options(call)
    known = {"output_mode", "task_description", "examples", "input", "categories", *MODEL_NAMES, *IGNORED}
    unknown = sorted(set(options) - known)
    if unknown:
        raise fail_at(f"{call.spelling} has no option {unknown[0]!r} with output_mode 'multi'", call.node)
    prompt = exp.Anonymous(this="PROMPT", expressions=[exp.Literal.string("{0}"), first.copy()]) \
        if _is_plain(first) else _as_prompt(first, call)
    template, arguments = str(prompt.expressions[0].this), prompt.expressions[1:]
    task = options.get("task_description")
    intro = f"{task.this}\n" if task is not None and _is_text(task) else ""
    verdicts = []
    for label in read_labels(categories):
        if "{" in label.name + (label.description or "") or "}" in label.name + (label.description or ""):
            raise fail_at(f"{call.spelling} label {label.name!r} has braces: a multi-label question cannot hold "
                          "them", categories)
        described = f" ({label.description})" if label.description else ""
        text = f'{template}\n\n{intro}Does it belong to the category "{label.name}"{described}?'
        entries = [exp.PropertyEQ(this=exp.to_identifier(key), expression=value) for key, value in
                   (("examples", _label_examples(options.get("examples"), label.name, call)),
                    (MODEL_OPTION, _named_model(options))) if value is not None]
        question = exp.Anonymous(this="PROMPT", expressions=[exp.Literal.string(text), *(a.copy() for a in arguments)])
        verdict = exp.Anonymous(this="AI_FILTER", expressions=[question, *([exp.Struct(expressions=entries)]
                                                                             if entries else [])])
        verdicts.append((verdict, label.name))
    empty = exp.cast(exp.Array(expressions=[]), exp.DataType.build("VARCHAR[]", dialect="duckdb"))
    lists = [exp.Case(ifs=[exp.If(this=verdict.copy(), true=exp.Array(expressions=[exp.Literal.string(name)]))],
                      default=empty.copy()) for verdict, name in verdicts]
    return exp.Case(ifs=[exp.If(this=exp.Is(this=verdicts[0][0].copy(), expression=exp.Null()), true=exp.Null())],
                    default=exp.Anonymous(this="FLATTEN", expressions=[exp.Array(expressions=lists)]))


def _named_model(options: dict[str, exp.Expression]) -> exp.Expression | None:
    named = next((options[k] for k in (MODEL_OPTION, *sorted(MODEL_NAMES)) if k in options), None)
    return None if named is None else named.copy()


def _label_examples(node: exp.Expression | None, label: str, call: AiCall) -> exp.Expression | None:
    """Snowflake's multi-label examples (`{'input': …, 'labels': [...], 'explanation': …}`) as one label's few-shot
    examples: TRUE where the example lists the label."""
    if node is None:
        return None
    try:
        examples = _literal(node)
    except ValueError as error:
        raise fail_at(f"{call.spelling} examples {safe_sql(node)}: {error}", node) from None
    if not isinstance(examples, list) or not all(isinstance(e, dict) and isinstance(e.get("input"), str)
                                                 and isinstance(e.get("labels"), list) for e in examples):
        raise fail_at(f"{call.spelling} examples with output_mode 'multi': write [{{'input': 'a text', 'labels': "
                      "['a', ...]}}, ...]", node)
    return exp.Array(expressions=[exp.Tuple(expressions=[exp.Literal.string(e["input"]),
                                                         exp.Boolean(this=label in e["labels"])])
                                  for e in examples])


def unused_options(statement: exp.Expression) -> tuple[str, ...]:
    """A remark per named argument that Quail accepts and has no use for (`connection_id => …`), for explain()."""
    remarks = []
    for call in [c for c in (ai_call(n) for n in statement.walk()) if c is not None]:
        for argument in call.arguments:
            if isinstance(argument, exp.Kwarg) and argument.this.name.lower() in IGNORED:
                remarks.append(f"{call.spelling}: {argument.this.name} => {argument.expression.sql()} accepted and "
                               "unused (it says how a warehouse's service runs the call; Quail runs it here)")
    return tuple(dict.fromkeys(remarks))


def canonical_calls(statement: exp.Expression) -> exp.Expression:
    """`statement` with every AI call in its PROMPT form and positional arguments (the tree is changed in place)."""
    for node in [n for n in statement.walk() if _is_generate_table(n)]:
        node.replace(_generated_table(node))
    for node in [n for n in statement.walk() if _is_sentiment(n)]:
        node.replace(_sentiment(node))
    for node in [n for n in statement.walk() if isinstance(n, exp.JSONExtract) and _structured(n.this)]:
        node.replace(_field_path(node))
    for node in [n for n in statement.walk() if _reads_classification(n)]:
        node.replace(_labels(node))
    for call in [c for c in (ai_call(n) for n in list(statement.walk())) if c is not None and _multi_label(c)]:
        call.node.replace(_each_label(call))
    canonical_embeddings(statement)
    refuse_other_ai_functions(statement)
    for call in [c for c in (ai_call(n) for n in list(statement.walk())) if c is not None and c.kind != "embed"]:
        if not _within(call.node, statement):
            continue  # inside a call already respelled
        arguments = _generate_arguments(call) if call.kind == "generate" else _positional(call)
        if arguments is None:
            continue
        first = arguments[0] if arguments else None
        if first is not None and not (call.kind == "classify" and _is_plain(first)):
            arguments[0] = _as_prompt(first, call)
        call.node.replace(_respelled(call, arguments))
    return statement


def _positional(call: AiCall) -> list[exp.Expression] | None:
    """The call's arguments in order, named ones put in their place; None when it needs no change."""
    named = [a for a in call.arguments if isinstance(a, exp.Kwarg)]
    positional = [a for a in call.arguments if not isinstance(a, exp.Kwarg)]
    first = positional[0] if positional else None
    flagged = call.kind == "filter" and len(positional) == 2 and isinstance(positional[1], exp.Boolean)
    if not named and not flagged and isinstance(first, exp.Anonymous) and str(first.name).upper() == "PROMPT":
        return None
    if not named and call.kind == "classify" and first is not None and _is_plain(first):
        return None
    prompt, categories, model, mode, examples = None, None, None, None, None
    for argument in named:
        name = argument.this.name.lower()
        if name in IGNORED:
            continue
        if name in MODEL_NAMES:
            model = _model_name(argument.expression, call)
            continue
        if name == "output_mode" and call.kind == "classify":
            mode = argument.expression
            continue
        if name == "examples":
            examples = argument.expression
            continue
        if name in REFUSED:
            raise unsupported(f"{call.spelling}(..., {name} => ...)", argument, REFUSED[name])
        if name in PROMPT_NAMES:
            prompt = argument.expression
        elif name == "categories" and call.kind == "classify":
            categories = argument.expression
        else:
            raise fail_at(f"{call.spelling} has no argument {name!r}", argument)
    if prompt is not None:
        positional.insert(0, prompt)
    if categories is not None:
        positional.insert(1, categories)
    if call.kind == "filter" and len(positional) == 2 and isinstance(positional[1], exp.Boolean):
        positional.pop()  # Snowflake's error-details flag: Quail's errors are raised, not returned per row
    place = 2 if call.kind == "classify" else 1
    for key, value in ((MODEL_OPTION, model), ("output_mode", mode), ("examples", examples)):
        if value is not None:
            _with_option(positional, place, key, value)
    return positional


def _model_name(node: exp.Expression, call: AiCall) -> exp.Expression:
    """The model a call names: a string (a catalog model or an alias, `Session` resolves it)."""
    if not _is_text(node):
        raise unsupported(f"{call.spelling} model {safe_sql(node)}", node, "name the model as a string")
    return node


def _with_option(arguments: list[exp.Expression], place: int, key: str, value: exp.Expression) -> None:
    """A named argument (the model, an output mode) as an entry of the options object at `place` (made when the call
    has none)."""
    entry = exp.PropertyEQ(this=exp.to_identifier(key), expression=value.copy())
    if len(arguments) > place and isinstance(arguments[place], exp.Struct):
        arguments[place].append("expressions", entry)
    elif len(arguments) == place:
        arguments.append(exp.Struct(expressions=[entry]))


GENERATE_NAMES = {"prompt": 1, "model": 0, "endpoint": 0, "model_parameters": 2, "model_params": 2,
                  "response_format": 3, "output_schema": 3}
"""AI_COMPLETE(model, prompt, model_parameters, response_format)'s places for the named arguments of both warehouses
(BigQuery's AI.GENERATE has no positional model: its prompt comes first)."""


def _generate_arguments(call: AiCall) -> list[exp.Expression] | None:
    """AI.GENERATE / AI_COMPLETE as (PROMPT(...)[, options]): BigQuery's `model_params` JSON and Snowflake's
    `model_parameters` object both become the options object `calls.generate_arguments` reads, with the model
    the call names as its `model` entry. None when the call is in that form already."""
    first = call.arguments[0] if call.arguments else None
    if (isinstance(first, exp.Anonymous) and str(first.name).upper() == "PROMPT"
            and not any(isinstance(a, exp.Kwarg) for a in call.arguments)):
        return None
    if call.spelling == "AI_EXTRACT":
        return _extract_arguments(call)
    slots: dict[int, exp.Expression] = {}
    offset = 0 if call.spelling.startswith("AI_") else 1
    for index, argument in enumerate(call.arguments):
        if isinstance(argument, exp.Kwarg):
            name = argument.this.name.lower()
            if name in IGNORED or name == "request_type":
                continue
            if name not in GENERATE_NAMES:
                raise fail_at(f"{call.spelling} has no argument {name!r}", argument)
            slot, value = GENERATE_NAMES[name], argument.expression
        else:
            slot, value = index + offset, argument
        if slot in slots:
            raise fail_at(f"{call.spelling} names its {_SLOT_NAMES[slot]} twice", value)
        slots[slot] = value
    if 1 not in slots:
        raise fail_at(f"{call.spelling} has no prompt", call.node)
    options = _model_parameters(slots[2], call) if 2 in slots else exp.Struct(expressions=[])
    if 0 in slots:
        options.append("expressions", exp.PropertyEQ(this=exp.to_identifier(MODEL_OPTION),
                                                     expression=_model_name(slots[0], call).copy()))
    schema = _schema_of(call, slots.get(3))
    if schema is not None:
        options.append("expressions", exp.PropertyEQ(this=exp.to_identifier("output_schema"),
                                                     expression=exp.Literal.string(json.dumps(json_schema(schema)))))
    arguments = [_as_prompt(slots[1], call)]
    if options.expressions:
        arguments.append(options)
    return arguments


EXTRACT_INSTRUCTION = "Extract these fields from {0}; use an empty text where it does not say."


def _extract_arguments(call: AiCall) -> list[exp.Expression]:
    """Snowflake's AI_EXTRACT(text, responseFormat) — named `text =>`, `responseFormat =>` too — as
    (PROMPT(instruction, text), {'output_schema': …}); the fields' questions become their descriptions."""
    named = {a.this.name.lower(): a.expression for a in call.arguments if isinstance(a, exp.Kwarg)}
    positional = [a for a in call.arguments if not isinstance(a, exp.Kwarg)]
    if "file" in named:
        raise unsupported("AI_EXTRACT(file => ...)", named["file"], "Quail reads text columns; pass text => column")
    unknown = sorted(set(named) - {"text", "responseformat", "response_format"})
    if unknown:
        raise fail_at(f"AI_EXTRACT has no argument {unknown[0]!r}", call.node)
    text = named.get("text", positional[0] if positional else None)
    response = named.get("responseformat", named.get("response_format",
                                                      positional[1] if len(positional) > 1 else None))
    if text is None or response is None:
        raise fail_at("AI_EXTRACT takes the text and a responseFormat", call.node)
    if not _is_plain(text):
        raise unsupported(f"AI_EXTRACT over {safe_sql(text)}", text, "extract from a column: text => r.body")
    schema = _checked(_extract_schema(response), response)
    prompt = exp.Anonymous(this="PROMPT", expressions=[exp.Literal.string(EXTRACT_INSTRUCTION), text.copy()])
    option = exp.PropertyEQ(this=exp.to_identifier("output_schema"),
                            expression=exp.Literal.string(json.dumps(json_schema(schema))))
    return [prompt, exp.Struct(expressions=[option])]


def _extract_schema(node: exp.Expression) -> SchemaType:
    """{'field': 'question', ...}, ['question', ...], [['field', 'question'], ...] or a JSON Schema."""
    try:
        document = _literal(node)
        if isinstance(document, dict) and ("type" in document or "schema" in document):
            schema = from_json_schema(document.get("schema", document))
            if schema.kind != "struct":
                raise ValueError("the top level is an object of fields")
            return schema
        if isinstance(document, dict):
            pairs = list(document.items())
        elif isinstance(document, list):
            pairs = [(q, q) if isinstance(q, str) else tuple(q) if isinstance(q, list) and len(q) == 2 else (None, None)
                     for q in document]
        else:
            raise ValueError("write {'field': 'question', ...}")
        if not pairs or any(not isinstance(k, str) or not k or not isinstance(q, str) for k, q in pairs):
            raise ValueError("each field is a name and a question, both text")
        return SchemaType("struct", fields=tuple(SchemaField(k, SchemaType("string"), q) for k, q in pairs))
    except ValueError as error:
        raise fail_at(f"AI_EXTRACT responseFormat {safe_sql(node)}: {error}", node) from None


SINGLE_VALUES: dict[str, Kind] = {"AI.GENERATE_BOOL": "bool", "AI.GENERATE_INT": "int", "AI.GENERATE_DOUBLE": "double"}
"""BigQuery's typed generations: a STRUCT whose `result` has the type."""


def _schema_of(call: AiCall, node: exp.Expression | None) -> SchemaType | None:
    """The schema a call's output is held to: BigQuery's `output_schema => 'actor STRING, year INT64'`, Snowflake's
    `response_format => {'type': 'json', 'schema': {...}}` (or the JSON Schema itself), `AI.GENERATE_INT`'s
    `result`; None for text."""
    if call.spelling in SINGLE_VALUES:
        if node is not None:
            raise unsupported(f"{call.spelling}(..., output_schema)", node, f"{call.spelling} returns its own type")
        return struct({"result": SchemaType(SINGLE_VALUES[call.spelling])})
    if node is None:
        return None
    try:
        if _is_text(node) and str(node.this).upper().startswith("TYPE OBJECT"):
            return _checked(_snowflake_type(str(node.this)[len("TYPE "):]), node)
        if _is_text(node) and call.spelling.startswith("AI."):
            return _checked(_bigquery_schema(str(node.this)), node)
        document = _literal(node)
        if isinstance(document, str):
            document = json.loads(document)
        if isinstance(document, dict) and document.get("type") == "json":
            if "schema" not in document:
                raise ValueError("a response format {'type': 'json', ...} names its fields in 'schema'")
            document = document["schema"]
        schema = from_json_schema(document)
    except ValueError as error:
        raise fail_at(f"{call.spelling} output schema {safe_sql(node)}: {error}", node) from None
    if schema.kind != "struct":
        raise fail_at(f"{call.spelling} output schema {safe_sql(node)}: the top level is an object of fields", node)
    return _checked(schema, node)


def _checked(schema: SchemaType, node: exp.Expression) -> SchemaType:
    if any(f.name.lower() in RESERVED_FIELDS for f in schema.fields):
        raise fail_at(f"an output schema field may not be named {', '.join(sorted(RESERVED_FIELDS))}: the answer "
                      "has those fields itself", node)
    return schema


RESERVED_FIELDS = frozenset({"status", "full_response"})
BIGQUERY_TYPES: dict[exp.DataType.Type, Kind] = {
    exp.DataType.Type.TEXT: "string", exp.DataType.Type.VARCHAR: "string", exp.DataType.Type.BIGINT: "int",
    exp.DataType.Type.INT: "int", exp.DataType.Type.DOUBLE: "double", exp.DataType.Type.FLOAT: "double",
    exp.DataType.Type.BOOLEAN: "bool", exp.DataType.Type.BIGDECIMAL: "double",
}


def _bigquery_schema(text: str) -> SchemaType:
    """'actor STRING, year INT64, tags ARRAY<STRING>, info STRUCT<a FLOAT64>' as a schema."""
    try:
        built = exp.DataType.build(f"STRUCT<{text}>", dialect="bigquery")
    except Exception as error:  # sqlglot raises its own ParseError and others on malformed types
        raise ValueError(f"not a list of 'name TYPE' pairs ({error})") from None
    return _from_data_type(built)


def _snowflake_type(text: str) -> SchemaType:
    """Snowflake's 'OBJECT(name VARCHAR, year NUMBER, tags ARRAY(VARCHAR), …)' as a schema."""
    try:
        built = exp.DataType.build(text, dialect="snowflake")
    except Exception as error:  # sqlglot raises its own ParseError and others on malformed types
        raise ValueError(f"not an OBJECT(name TYPE, …) ({error})") from None
    return _from_data_type(built)


def _from_data_type(node: exp.DataType) -> SchemaType:
    if node.this == exp.DataType.Type.DECIMAL:  # Snowflake's NUMBER is NUMBER(38, 0), whole; BigQuery's NUMERIC not
        scale = node.expressions[1].this.this if len(node.expressions) > 1 else None
        return SchemaType("int" if str(scale) == "0" else "double")
    if node.this in (exp.DataType.Type.STRUCT, exp.DataType.Type.OBJECT):
        fields = []
        for column in node.expressions:
            if not isinstance(column, exp.ColumnDef) or not isinstance(column.args.get("kind"), exp.DataType):
                raise ValueError(f"{column.sql()} is not 'name TYPE'")
            fields.append(SchemaField(column.name, _from_data_type(column.args["kind"])))
        return SchemaType("struct", fields=tuple(fields))
    if node.this == exp.DataType.Type.ARRAY and len(node.expressions) == 1:
        return SchemaType("list", item=_from_data_type(node.expressions[0]))
    kind = BIGQUERY_TYPES.get(node.this)
    if kind is None:
        raise ValueError(f"type {node.sql(dialect='bigquery')} is not one of STRING, INT64, FLOAT64, BOOL, ARRAY, "
                         "STRUCT")
    return SchemaType(kind)


def _literal(node: exp.Expression) -> object:
    """An object / array / scalar literal of the statement as Python data (a JSON Schema written in SQL)."""
    if isinstance(node, exp.Struct):
        entries = [struct_field(item) for item in node.expressions]
        if any(entry is None for entry in entries):
            raise ValueError("write {'key': value, ...}")
        return {key: _literal(value) for key, value in (e for e in entries if e is not None)}
    if isinstance(node, exp.Array):
        return [_literal(item) for item in node.expressions]
    if isinstance(node, exp.Boolean):
        return bool(node.this)
    if _is_text(node):
        return str(node.this)
    if isinstance(node, exp.Literal):
        return float(node.this) if "." in node.this else int(node.this)
    if isinstance(node, exp.ParseJSON | exp.JSON):
        return _literal(node.this)
    raise ValueError(f"{safe_sql(node)} is not a literal")


_SLOT_NAMES = {0: "model", 1: "prompt", 2: "model parameters", 3: "response format"}


def _model_parameters(node: exp.Expression, call: AiCall) -> exp.Expression:
    """Snowflake's `{'max_tokens': 100, 'temperature': 0}` as it is; BigQuery's `JSON '{"generationConfig":
    {"maxOutputTokens": 100}}'` as the same object."""
    if isinstance(node, exp.Struct):
        return node
    text = node.this if isinstance(node, exp.ParseJSON | exp.JSON) else node
    if not (isinstance(text, exp.Literal) and text.is_string):
        raise unsupported(f"{call.spelling} model parameters {node.sql()}", node,
                          "write {'max_tokens': 100} or JSON '{\"generationConfig\": {\"maxOutputTokens\": 100}}'")
    try:
        parsed = json.loads(str(text.this))
    except ValueError as error:
        raise fail_at(f"{call.spelling} model parameters are not JSON: {error}", node) from None
    config = parsed.get("generationConfig", parsed) if isinstance(parsed, dict) else None
    if not isinstance(config, dict):
        raise fail_at(f"{call.spelling} model parameters must be a JSON object, got {text.this}", node)
    renamed = {"maxOutputTokens": "max_tokens", "topP": "top_p", "topK": "top_k"}
    entries = [exp.PropertyEQ(this=exp.to_identifier(renamed.get(key, key)), expression=_json_value(value, node))
               for key, value in config.items()]
    return exp.Struct(expressions=entries)


def _json_value(value: object, node: exp.Expression) -> exp.Expression:
    if isinstance(value, bool):
        return exp.Boolean(this=value)
    if isinstance(value, int | float):
        return exp.Literal.number(value)
    if isinstance(value, str):
        return exp.Literal.string(value)
    raise fail_at(f"model parameter value {json.dumps(value)} is not a number, string or boolean", node)


def _within(node: exp.Expression, root: exp.Expression) -> bool:
    while node is not root:
        if node.parent is None:
            return False
        node = node.parent
    return True


def _is_plain(node: exp.Expression) -> bool:
    return isinstance(node, exp.Column)


def _as_prompt(node: exp.Expression, call: AiCall) -> exp.Expression:
    """PROMPT(template, arguments...) for a tuple, a concatenation, a string or one expression."""
    if isinstance(node, exp.Anonymous) and str(node.name).upper() == "PROMPT":
        return node
    parts = _parts(node)
    template, arguments = "", []
    for part in parts:
        if _is_text(part):
            text = str(part.this)
            if "{" in text or "}" in text:
                raise fail_at(f"the prompt of {call.spelling} has braces in its text; write PROMPT('…{{0}}…', ...) "
                              "with the text around the placeholders", part)
            template += text
        else:
            template += f"{{{len(arguments)}}}"
            arguments.append(part.copy())
    if not arguments:  # a constant question: the question is the document
        template, arguments = "{0}", [exp.Literal.string(template)]
    return exp.Anonymous(this="PROMPT", expressions=[exp.Literal.string(template), *arguments])


def _parts(node: exp.Expression) -> list[exp.Expression]:
    if isinstance(node, exp.Tuple):
        return [p for item in node.expressions for p in _parts(item)]
    if isinstance(node, exp.DPipe):
        return _parts(node.this) + _parts(node.expression)
    if isinstance(node, exp.Concat) or (isinstance(node, exp.Anonymous) and str(node.name).upper() == "CONCAT"):
        return [p for item in node.expressions for p in _parts(item)]
    if isinstance(node, exp.Paren):
        return _parts(node.this)
    return [node]


def _is_text(node: exp.Expression) -> bool:
    return (isinstance(node, exp.Literal) and node.is_string) or isinstance(node, exp.RawString)


def _respelled(call: AiCall, arguments: list[exp.Expression]) -> exp.Expression:
    """The call in its dialect's plain spelling with these arguments."""
    if call.spelling.startswith("AI."):
        inner = exp.Anonymous(this=call.spelling[3:], expressions=arguments)
        return exp.Dot(this=exp.to_identifier("AI"), expression=inner)
    return exp.Anonymous(this=call.spelling, expressions=arguments)
