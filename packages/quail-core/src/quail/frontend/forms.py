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

from quail.frontend.syntax import AiCall, ai_call, fail_at, refuse_other_ai_functions, unsupported

IGNORED = frozenset({"connection_id", "max_error_ratio", "optimization_mode"})
"""Named arguments of the warehouses that say how their service runs the call: nothing for Quail to do."""
PROMPT_NAMES = frozenset({"prompt", "input"})
REFUSED = {
    "endpoint": "Quail answers with the session's model (EngineConfig.model / --model); a model per call is not "
                "supported yet",
    "model": "Quail answers with the session's model (EngineConfig.model / --model); a model per call is not "
             "supported yet",
    "model_params": "a judgement is one next-token readout: no temperature or output length applies",
    "examples": "give them in the options object: {'examples': [('a document', TRUE), ...]} after the prompt, "
                "[('a document', 'label'), ...] after AI.CLASSIFY's labels",
    "output_schema": "AI.IF / AI.SCORE / AI.CLASSIFY return a fixed type",
}


def unused_options(statement: exp.Expression) -> tuple[str, ...]:
    """A remark per named argument that Quail accepts and has no use for (`connection_id => …`), for explain()."""
    remarks = []
    for call in [c for c in (ai_call(n) for n in statement.walk()) if c is not None]:
        model = _named_model(call) if call.kind == "generate" else None
        if model is not None:
            remarks.append(f"{call.spelling}: model {model} is answered by the session's model (EngineConfig.model "
                           "/ --model); a model per call is not supported yet")
        for argument in call.arguments:
            if isinstance(argument, exp.Kwarg) and argument.this.name.lower() in IGNORED:
                remarks.append(f"{call.spelling}: {argument.this.name} => {argument.expression.sql()} accepted and "
                               "unused (it says how a warehouse's service runs the call; Quail runs it here)")
    return tuple(dict.fromkeys(remarks))


def canonical_calls(statement: exp.Expression) -> exp.Expression:
    """`statement` with every AI call in its PROMPT form and positional arguments (the tree is changed in place)."""
    refuse_other_ai_functions(statement)
    for call in [c for c in (ai_call(n) for n in list(statement.walk())) if c is not None]:
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
    prompt, categories = None, None
    for argument in named:
        name = argument.this.name.lower()
        if name in IGNORED:
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
    return positional


GENERATE_NAMES = {"prompt": 1, "model": 0, "endpoint": 0, "model_parameters": 2, "model_params": 2,
                  "response_format": 3, "output_schema": 3}
"""AI_COMPLETE(model, prompt, model_parameters, response_format)'s places for the named arguments of both warehouses
(BigQuery's AI.GENERATE has no positional model: its prompt comes first)."""
STRUCTURED = ("structured output (response_format / output_schema) is not supported yet: AI.GENERATE and AI_COMPLETE "
              "return text")


def _generate_arguments(call: AiCall) -> list[exp.Expression] | None:
    """AI.GENERATE / AI_COMPLETE as (PROMPT(...)[, options]): BigQuery's `model_params` JSON and Snowflake's
    `model_parameters` object both become the options object `calls.generate_arguments` reads; the model is
    named in explain (`unused_options`), never used. None when the call is in that form already."""
    first = call.arguments[0] if call.arguments else None
    if (isinstance(first, exp.Anonymous) and str(first.name).upper() == "PROMPT"
            and not any(isinstance(a, exp.Kwarg) for a in call.arguments)):
        return None
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
    if 3 in slots:
        raise unsupported(f"{call.spelling}(..., response_format)", slots[3], STRUCTURED)
    if 1 not in slots:
        raise fail_at(f"{call.spelling} has no prompt", call.node)
    arguments = [_as_prompt(slots[1], call)]
    if 2 in slots:
        arguments.append(_model_parameters(slots[2], call))
    return arguments


_SLOT_NAMES = {0: "model", 1: "prompt", 2: "model parameters", 3: "response format"}


def _named_model(call: AiCall) -> str | None:
    """The model a generation call names (`'llama3.1-8b'`, `model => …`, `endpoint => …`), as written."""
    offset = 0 if call.spelling.startswith("AI_") else 1
    for index, argument in enumerate(call.arguments):
        if isinstance(argument, exp.Kwarg) and argument.this.name.lower() in ("model", "endpoint"):
            return argument.expression.sql()
        if not isinstance(argument, exp.Kwarg) and index + offset == 0 and _is_text(argument):
            return argument.sql()
    return None


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
