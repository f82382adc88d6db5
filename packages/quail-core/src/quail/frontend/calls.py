"""The arguments of an AI call: its PROMPT, options, labels — read into spec values, or refused by name."""

from __future__ import annotations

import json
from dataclasses import replace

import pyarrow as pa
from sqlglot import exp

from quail.errors import CompileError
from quail.frontend.spec import ColumnName, PromptSpec
from quail.frontend.syntax import OUTPUT_TYPES, AiCall, beyond_one_block, fail_at, safe_sql, unsupported, where_of
from quail.logical.expressions import Example, Label
from quail.schemas import STATUS, SchemaType, answer_type, arrow_type, from_json_schema

Options = dict[str, exp.Expression]
MODEL_OPTION = "model"
"""The option naming the model a call answers with (`frontend.models` resolves it)."""


def is_plain_column(node: exp.Expression) -> bool:
    return isinstance(node, exp.Column) and isinstance(node.this, exp.Identifier) and not node.args.get("db")


def column_name(node: exp.Expression) -> ColumnName:
    return ColumnName(node.table or None, node.name, where_of(node))


def prompt_and_options(call: AiCall, keys: set[str]) -> tuple[PromptSpec, Options]:
    """PROMPT(...) and the optional options object of AI_FILTER / AI.IF / AI.SCORE; its few-shot `examples`
    (`[('text', TRUE), ...]`) travel with the prompt."""
    if not call.arguments:
        raise unsupported(f"{call.spelling}() without arguments", call.node, "pass PROMPT('…{0}…', column)")
    if len(call.arguments) > 2:
        raise unsupported(f"{call.spelling} with {len(call.arguments)} arguments", call.node,
                          "pass PROMPT(...) and an optional options object")
    prompt = read_prompt(call.arguments[0], call.spelling)
    keys = keys | {"examples", "symmetric", MODEL_OPTION}
    options = read_options(call.arguments[1], keys) if len(call.arguments) == 2 else {}
    options.pop(MODEL_OPTION, None)  # the block's model (`frontend.models`)
    if "examples" in options:
        prompt = replace(prompt, examples=read_examples(options.pop("examples"), None))
    if "symmetric" in options:
        prompt = replace(prompt, symmetric=boolean_option(options.pop("symmetric"), "symmetric"))
    return prompt, options


def read_prompt(node: exp.Expression, owner: str) -> PromptSpec:
    if not (isinstance(node, exp.Anonymous) and str(node.name).upper() == "PROMPT"):
        raise beyond_one_block(f"{owner} over {safe_sql(node)}", node, f"write {owner}(PROMPT('…{{0}}…', column))")
    arguments = list(node.expressions)
    if not arguments or not _is_string(arguments[0]):
        raise unsupported("PROMPT without a template string", node, "its first argument is a string literal")
    columns = []
    for argument in arguments[1:]:
        if not is_plain_column(argument):
            raise beyond_one_block(f"PROMPT argument {safe_sql(argument)}", argument, "PROMPT arguments are columns")
        columns.append(column_name(argument))
    return PromptSpec(arguments[0].this, tuple(columns), where_of(node))


def _is_string(node: exp.Expression) -> bool:
    """A string literal: quoted, or Snowflake's dollar-quoted `$$...$$` (sqlglot's RawString)."""
    return (isinstance(node, exp.Literal) and node.is_string) or isinstance(node, exp.RawString)


def classify_arguments(call: AiCall) -> tuple[PromptSpec, tuple[Label, ...], str | None]:
    """AI.CLASSIFY(input, labels [, options]): the input (a column or PROMPT), labels, task description."""
    if len(call.arguments) not in (2, 3):
        raise unsupported(f"{call.spelling} with {len(call.arguments)} arguments", call.node,
                          "pass the input, the labels and optional options")
    first = call.arguments[0]
    if is_plain_column(first):
        prompt = PromptSpec("{0}", (column_name(first),), where_of(first))
    else:
        prompt = read_prompt(first, "AI.CLASSIFY")
    labels = read_labels(call.arguments[1])
    keys = {"task_description", "examples", "output_mode", MODEL_OPTION}
    options = read_options(call.arguments[2], keys) if len(call.arguments) == 3 else {}
    mode = string_option(options, "output_mode")
    if mode is not None and mode.lower() != "single":
        raise unsupported(f"output_mode {mode!r} here", options["output_mode"], "write output_mode 'multi' in the "
                          "call's own options object, or 'single'")
    if "examples" in options:
        prompt = replace(prompt, examples=read_examples(options["examples"], labels))
    return prompt, labels, string_option(options, "task_description")


DEFAULT_MAX_TOKENS = 128
"""Tokens AI.GENERATE / AI_COMPLETE generate at most per row unless `max_tokens` (Snowflake) or `maxOutputTokens`
(BigQuery) says otherwise: a paragraph — decoding costs a pass over the weights per token, so a generous default
would make every unbounded call slow on a CPU."""
MAX_TOKENS_LIMIT = 8192
GENERATE_OPTIONS = {"max_tokens", "temperature", "top_p", "top_k", "guardrails", "output_schema", MODEL_OPTION}
"""What a generation's options object may hold (the warehouses' model parameters, in `forms`' canonical form)."""
GREEDY_OPTIONS = {"temperature": 0.0, "top_p": 1.0, "top_k": 1.0}
"""Sampling options a greedy decoder honours only at these values (top_k 1 is greedy; 0 or absent means unset)."""


def generate_arguments(call: AiCall) -> tuple[PromptSpec, int, SchemaType | None]:
    """AI.GENERATE / AI_COMPLETE / AI_EXTRACT in their PROMPT form (`forms.canonical_calls`): the prompt, the token
    bound and the output schema (None for text). Quail decodes greedily — the answer store's promise that a prompt
    is never paid twice rests on it — so a temperature above 0 is refused rather than ignored."""
    if not call.arguments or len(call.arguments) > 2:
        raise unsupported(f"{call.spelling} with {len(call.arguments)} arguments", call.node,
                          "pass the prompt and an optional {'max_tokens': n}")
    prompt = read_prompt(call.arguments[0], call.spelling)
    options = read_options(call.arguments[1], GENERATE_OPTIONS) if len(call.arguments) == 2 else {}
    for key, greedy in GREEDY_OPTIONS.items():
        if key in options:
            value = number(options[key])
            if value is None or (value != greedy and not (key == "top_k" and value == 0)):
                raise fail_at(f"{key} {safe_sql(options[key])}: Quail decodes greedily (temperature 0), so the same "
                              "prompt always gets the same text; drop the option or set it to "
                              f"{greedy:g}", options[key])
    if "guardrails" in options and boolean_option(options["guardrails"], "guardrails"):
        raise unsupported("guardrails => TRUE", options["guardrails"], "Quail runs no content filter")
    schema = _output_schema(options["output_schema"]) if "output_schema" in options else None
    default = STRUCTURED_MAX_TOKENS if schema is not None else DEFAULT_MAX_TOKENS
    return prompt, _max_tokens(options.get("max_tokens"), default), schema


def generation_schema(call: AiCall) -> SchemaType | None:
    """The output schema of a generation in its PROMPT form (None for text), read from its options alone: what its
    value's type depends on, whatever its prompt reads."""
    if len(call.arguments) != 2:
        return None
    options = read_options(call.arguments[1], GENERATE_OPTIONS)
    return _output_schema(options["output_schema"]) if "output_schema" in options else None


STRUCTURED_MAX_TOKENS = 256
"""The bound of a structured generation unless given: its JSON spells every field name, so it takes more tokens
than the same answer as text; a row cut off before its JSON closes gets NULL fields and a status saying so."""


def _output_schema(node: exp.Expression) -> SchemaType:
    """The canonical form's JSON Schema text (`forms` writes it from either warehouse's spelling)."""
    if not (isinstance(node, exp.Literal) and node.is_string):
        raise unsupported(f"output_schema {safe_sql(node)}", node, "write output_schema => 'name STRING, ...'")
    try:
        schema = from_json_schema(json.loads(str(node.this)))
    except ValueError as error:
        raise fail_at(f"output_schema: {error}", node) from None
    if schema.kind != "struct":
        raise fail_at("output_schema: the top level is an object of fields", node)
    return schema


def output_type(call: AiCall) -> pa.DataType:
    """The type of the call's output column: its kind's, or a structured generation's STRUCT (fields + status)."""
    if call.kind == "generate":
        schema = generation_schema(call)
        if schema is not None:
            return answer_type(schema)
    return OUTPUT_TYPES[call.kind]


def call_value(call: AiCall, output: exp.Expression) -> exp.Expression:
    """What the call reads as in the statement, given its output column (a STRUCT for a structured generation):
    * BigQuery's AI.GENERATE and AI.GENERATE_BOOL / INT / DOUBLE: the STRUCT its documentation describes — the
      text as `result` or the schema's fields, `full_response` NULL (there is no service response) and `status`
      ('' for a row answered, else why its output did not parse);
    * Snowflake's AI_EXTRACT: `{response: {fields}, error}`, `error` NULL when the output parsed;
    * AI_COMPLETE with a response format: the object of fields, NULL where the output did not parse;
    * BigQuery's AI.EMBED: `{result: the vector, status: ''}`;
    * every other call: its output itself."""
    if call.kind == "embed" and call.spelling.startswith("AI."):
        return _struct([("result", output), ("status", exp.Literal.string(""))])
    if call.kind != "generate":
        return output
    schema = generation_schema(call)
    if call.spelling.startswith("AI."):
        fields = [("result", output)] if schema is None else [(f.name, _field(output, f.name)) for f in schema.fields]
        status = exp.Literal.string("") if schema is None else _field(output, STATUS)
        return _struct([*fields, ("full_response", exp.cast(exp.null(), "VARCHAR")), ("status", status)])
    if schema is None:
        return output
    parsed = exp.If(this=exp.EQ(this=_field(output, STATUS), expression=exp.Literal.string("")),
                    true=_struct([(f.name, _field(output, f.name)) for f in schema.fields]))
    answer = exp.Case(ifs=[parsed])
    if call.spelling != "AI_EXTRACT":
        return answer
    error = exp.Nullif(this=_field(output, STATUS), expression=exp.Literal.string(""))
    return _struct([("response", answer), ("error", error)])


def value_type(call: AiCall) -> pa.DataType:
    """The type of what the call reads as in the statement (`call_value`)."""
    output = output_type(call)
    if call.kind == "embed" and call.spelling.startswith("AI."):
        return pa.struct([pa.field("result", output), pa.field("status", pa.string())])
    if call.kind != "generate":
        return output
    schema = generation_schema(call)
    fields = [] if schema is None else [pa.field(f.name, arrow_type(f.type)) for f in schema.fields]
    if call.spelling.startswith("AI."):
        head = fields or [pa.field("result", pa.string())]
        return pa.struct([*head, pa.field("full_response", pa.string()), pa.field("status", pa.string())])
    if schema is None:
        return output
    if call.spelling != "AI_EXTRACT":
        return pa.struct(fields)
    return pa.struct([pa.field("response", pa.struct(fields)), pa.field("error", pa.string())])


def _field(value: exp.Expression, name: str) -> exp.Expression:
    return exp.Dot(this=value.copy(), expression=exp.to_identifier(name, quoted=True))


def _struct(entries: list[tuple[str, exp.Expression]]) -> exp.Expression:
    return exp.Struct(expressions=[exp.PropertyEQ(this=exp.to_identifier(name, quoted=True), expression=value)
                                   for name, value in entries])


def duckdb_type(kind: pa.DataType) -> str:
    """An answer column's type as DuckDB spells it (the stand-ins' typed NULLs)."""
    if pa.types.is_struct(kind):
        return "STRUCT(" + ", ".join(f'"{kind.field(i).name}" {duckdb_type(kind.field(i).type)}'
                                     for i in range(kind.num_fields)) + ")"
    if pa.types.is_list(kind):
        return f"{duckdb_type(kind.value_type)}[]"
    return {pa.bool_(): "BOOLEAN", pa.float64(): "DOUBLE", pa.int64(): "BIGINT", pa.string(): "VARCHAR",
            pa.float32(): "FLOAT"}[kind]


def _max_tokens(node: exp.Expression | None, default: int) -> int:
    if node is None:
        return default
    value = number(node)
    if value is None or value != int(value) or not 1 <= value <= MAX_TOKENS_LIMIT:
        raise fail_at(f"max_tokens must be a whole number from 1 to {MAX_TOKENS_LIMIT}, got {safe_sql(node)}", node)
    return int(value)


MAX_EXAMPLES = 32
"""Demonstrations one call may carry: each is a document in every prompt of the call (or once, first)."""


def read_examples(node: exp.Expression, labels: tuple[Label, ...] | None) -> tuple[Example, ...]:
    """`[('text', TRUE), ...]` for a TRUE/FALSE question, `[('text', 'label'), ...]` for AI.CLASSIFY (`labels`);
    also Snowflake's objects `{'input': 'text', 'output': TRUE}` / `{'input': 'text', 'labels': ['label']}`."""
    if not isinstance(node, exp.Array) or not node.expressions:
        raise unsupported(f"examples {safe_sql(node)}", node, "write 'examples': [('a document', TRUE), ...]")
    if len(node.expressions) > MAX_EXAMPLES:
        raise fail_at(f"{len(node.expressions)} examples; a call takes at most {MAX_EXAMPLES}", node)
    return tuple(_example(entry, labels) for entry in node.expressions)


def _example(entry: exp.Expression, labels: tuple[Label, ...] | None) -> Example:
    text, answer = _example_parts(entry)
    if text is None or not (isinstance(text, exp.Literal) and text.is_string) or answer is None:
        hint = "('a document', 'label')" if labels is not None else "('a document', TRUE)"
        raise unsupported(f"example {safe_sql(entry)}", entry, f"an example is {hint}")
    if labels is None:
        if not isinstance(answer, exp.Boolean):
            raise unsupported(f"example answer {safe_sql(answer)}", answer, "the answer of an example is TRUE or FALSE "
                              "(AI.SCORE is the probability of TRUE: a high-scoring example is TRUE)")
        return Example(str(text.this), "TRUE" if answer.this else "FALSE")
    names = [label.name for label in labels]
    if not (isinstance(answer, exp.Literal) and answer.is_string) or answer.this not in names:
        raise fail_at(f"example label {safe_sql(answer)} is not one of the labels {', '.join(map(repr, names))}",
                      answer)
    return Example(str(text.this), str(answer.this))


def _example_parts(entry: exp.Expression) -> tuple[exp.Expression | None, exp.Expression | None]:
    """(text, answer) of a tuple or an object; an object's `labels` holds one label."""
    if isinstance(entry, exp.Tuple) and len(entry.expressions) == 2:
        return entry.expressions[0], entry.expressions[1]
    if not isinstance(entry, exp.Struct):
        return None, None
    fields = dict(field for item in entry.expressions if (field := struct_field(item)) is not None)
    answer = fields.get("output", fields.get("labels"))
    if isinstance(answer, exp.Array):
        answer = answer.expressions[0] if len(answer.expressions) == 1 else None
    return fields.get("input"), answer


def number(node: exp.Expression) -> float | None:
    if isinstance(node, exp.Neg):
        inner = number(node.this)
        return None if inner is None else -inner
    if isinstance(node, exp.Literal) and not node.is_string:
        try:
            return float(node.this)
        except ValueError:
            return None
    return None


def struct_field(entry: exp.Expression) -> tuple[str, exp.Expression] | None:
    """(key, value) of one entry of an object: Snowflake's `'key': value`, BigQuery's `value AS key`."""
    if isinstance(entry, exp.PropertyEQ):
        return entry.this.name, entry.expression
    if isinstance(entry, exp.Alias):
        return entry.alias, entry.this
    return None


def read_options(node: exp.Expression, keys: set[str]) -> Options:
    if not isinstance(node, exp.Struct):
        raise unsupported(f"options {safe_sql(node)}", node, "write {'key': value, ...}")
    options: Options = {}
    for entry in node.expressions:
        field = struct_field(entry)
        if field is None:
            raise unsupported(f"option {safe_sql(entry)}", entry, "write {'key': value, ...}")
        key, value = field
        if key not in keys:
            allowed = ", ".join(sorted(keys)) or "none"
            raise unsupported(f"option {key!r}", entry, f"options here: {allowed}")
        if key in options:
            raise unsupported(f"option {key!r} given twice", entry)
        options[key] = value
    return options


def selectivity(options: Options) -> float | None:
    value = options.get("selectivity")
    if value is None:
        return None
    found = number(value)
    if found is None:
        where = where_of(value)
        raise CompileError(f"selectivity must be a number in [0, 1], got {safe_sql(value)}", line=where.line,
                           column=where.column)
    return found


def boolean_option(value: exp.Expression, key: str) -> bool:
    if isinstance(value, exp.Boolean):
        return bool(value.this)
    raise unsupported(f"{key} {safe_sql(value)}", value, f"{key} is TRUE or FALSE")


def string_option(options: Options, key: str) -> str | None:
    value = options.get(key)
    if value is None:
        return None
    if isinstance(value, exp.Literal) and value.is_string:
        return str(value.this)
    if isinstance(value, exp.Column | exp.Identifier):
        return value.name
    raise unsupported(f"{key} {safe_sql(value)}", value, f"{key} is a string")


def _typed_labels(node: exp.Cast) -> exp.Expression:
    """BigQuery's typed array literal `ARRAY<STRUCT<label STRING, description STRING>>[('a', '…'), …]`: its tuples
    as `(label, description)` in the order the type names those two fields."""
    kind = node.args.get("to")
    fields = kind.expressions[0].expressions if isinstance(kind, exp.DataType) and kind.expressions and \
        isinstance(kind.expressions[0], exp.DataType) else []
    names = [f.name.lower() for f in fields if isinstance(f, exp.ColumnDef)]
    if sorted(names) != ["description", "label"]:
        return node
    order = [names.index("label"), names.index("description")]
    entries = []
    for entry in node.this.expressions:
        if not (isinstance(entry, exp.Tuple) and len(entry.expressions) == 2):
            return node
        entries.append(exp.Tuple(expressions=[entry.expressions[i].copy() for i in order]))
    return exp.Array(expressions=entries)


def _label_fields(entry: exp.Struct) -> tuple[str, str | None] | None:
    """Snowflake's `{'label': 'a', 'description': '…'}` and BigQuery's `STRUCT('a' AS label, '…' AS description)`."""
    fields: dict[str, str] = {}
    for item in entry.expressions:
        field = struct_field(item)
        if field is None:
            return None
        key, value = field
        if not (isinstance(value, exp.Literal) and value.is_string) or key.lower() not in ("label", "description"):
            return None
        fields[key.lower()] = value.this
    if "label" not in fields:
        return None
    return fields["label"], fields.get("description")


def read_labels(node: exp.Expression) -> tuple[Label, ...]:
    if isinstance(node, exp.Cast) and isinstance(node.this, exp.Array):
        node = _typed_labels(node)
    if not isinstance(node, exp.Array):
        raise unsupported(f"labels {safe_sql(node)}", node, "write ['a', 'b'] or [('a', 'description'), ...]")
    labels = []
    for entry in node.expressions:
        if isinstance(entry, exp.Literal) and entry.is_string:
            labels.append(Label(entry.this))
        elif isinstance(entry, exp.Tuple) and len(entry.expressions) == 2 and all(
                isinstance(e, exp.Literal) and e.is_string for e in entry.expressions):
            labels.append(Label(entry.expressions[0].this, entry.expressions[1].this))
        elif isinstance(entry, exp.Struct) and (fields := _label_fields(entry)) is not None:
            labels.append(Label(*fields))
        else:
            raise unsupported(f"label {safe_sql(entry)}", entry, "labels are strings or ('label', 'description')")
    return tuple(labels)
