"""The arguments of an AI call: its PROMPT, options, labels — read into spec values, or refused by name."""

from __future__ import annotations

from sqlglot import exp

from quail.errors import CompileError
from quail.frontend.spec import ColumnName, PromptSpec
from quail.frontend.syntax import AiCall, beyond_one_block, safe_sql, unsupported, where_of
from quail.logical.expressions import Label

Options = dict[str, exp.Expression]


def is_plain_column(node: exp.Expression) -> bool:
    return isinstance(node, exp.Column) and isinstance(node.this, exp.Identifier) and not node.args.get("db")


def column_name(node: exp.Expression) -> ColumnName:
    return ColumnName(node.table or None, node.name, where_of(node))


def prompt_and_options(call: AiCall, keys: set[str]) -> tuple[PromptSpec, Options]:
    """PROMPT(...) and the optional options object of AI_FILTER / AI.IF / AI.SCORE."""
    if not call.arguments:
        raise unsupported(f"{call.spelling}() without arguments", call.node, "pass PROMPT('…{0}…', column)")
    if len(call.arguments) > 2:
        raise unsupported(f"{call.spelling} with {len(call.arguments)} arguments", call.node,
                          "pass PROMPT(...) and an optional options object")
    prompt = read_prompt(call.arguments[0], call.spelling)
    options = read_options(call.arguments[1], keys) if len(call.arguments) == 2 else {}
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
    options = read_options(call.arguments[2], {"task_description"}) if len(call.arguments) == 3 else {}
    return prompt, labels, string_option(options, "task_description")


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
