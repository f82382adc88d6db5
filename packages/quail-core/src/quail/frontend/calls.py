"""The arguments of an AI call: its PROMPT, options, labels — read into spec values, or refused by name."""

from __future__ import annotations

from dataclasses import replace

from sqlglot import exp

from quail.errors import CompileError
from quail.frontend.spec import ColumnName, PromptSpec
from quail.frontend.syntax import AiCall, beyond_one_block, fail_at, safe_sql, unsupported, where_of
from quail.logical.expressions import Example, Label

Options = dict[str, exp.Expression]


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
    options = read_options(call.arguments[1], keys | {"examples", "symmetric"}) if len(call.arguments) == 2 else {}
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
    options = read_options(call.arguments[2], {"task_description", "examples"}) if len(call.arguments) == 3 else {}
    if "examples" in options:
        prompt = replace(prompt, examples=read_examples(options["examples"], labels))
    return prompt, labels, string_option(options, "task_description")


DEFAULT_MAX_TOKENS = 128
"""Tokens AI.GENERATE / AI_COMPLETE generate at most per row unless `max_tokens` (Snowflake) or `maxOutputTokens`
(BigQuery) says otherwise: a paragraph — decoding costs a pass over the weights per token, so a generous default
would make every unbounded call slow on a CPU."""
MAX_TOKENS_LIMIT = 8192
GREEDY_OPTIONS = {"temperature": 0.0, "top_p": 1.0, "top_k": 1.0}
"""Sampling options a greedy decoder honours only at these values (top_k 1 is greedy; 0 or absent means unset)."""


def generate_arguments(call: AiCall) -> tuple[PromptSpec, int]:
    """AI.GENERATE / AI_COMPLETE in their PROMPT form (`forms.canonical_calls`): the prompt and the token bound.
    Quail decodes greedily — the answer store's promise that a prompt is never paid twice rests on it — so a
    temperature above 0 is refused rather than ignored."""
    if not call.arguments or len(call.arguments) > 2:
        raise unsupported(f"{call.spelling} with {len(call.arguments)} arguments", call.node,
                          "pass the prompt and an optional {'max_tokens': n}")
    prompt = read_prompt(call.arguments[0], call.spelling)
    options = read_options(call.arguments[1], {"max_tokens", "temperature", "top_p", "top_k", "guardrails"}) \
        if len(call.arguments) == 2 else {}
    for key, greedy in GREEDY_OPTIONS.items():
        if key in options:
            value = number(options[key])
            if value is None or (value != greedy and not (key == "top_k" and value == 0)):
                raise fail_at(f"{key} {safe_sql(options[key])}: Quail decodes greedily (temperature 0), so the same "
                              "prompt always gets the same text; drop the option or set it to "
                              f"{greedy:g}", options[key])
    if "guardrails" in options and boolean_option(options["guardrails"], "guardrails"):
        raise unsupported("guardrails => TRUE", options["guardrails"], "Quail runs no content filter")
    return prompt, _max_tokens(options.get("max_tokens"))


def _max_tokens(node: exp.Expression | None) -> int:
    if node is None:
        return DEFAULT_MAX_TOKENS
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
            raise unsupported(f"example answer {safe_sql(answer)}", answer, "the answer of an example is TRUE or FALSE")
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
