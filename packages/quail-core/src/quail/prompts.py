"""Prompt binding: the canonical document-first layout, tokenized per part.

A document's KV must not depend on the question, so every prompt is rewritten to

    filter / score / classify:  [preamble][document][frame][question tail + answer cue]
    join:                       [preamble][anchor document][frame naming it DOCUMENT 0 + task]
                                then per pair [DOCUMENT 1: label][partner document]...[answer cue]

The preamble is the same short label for every role, so the KV of `[preamble][document]` computed
for a filter is the KV a join anchored on that document needs. Parts are tokenized separately and
their ids concatenated — never re-tokenized as one string — so the prefix ids are stable.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from quail.data.tokenizer import TokenIds, Tokenizer
from quail.errors import Refusal, RefusalError
from quail.logical.expressions import PLACEHOLDER, AiPredicate, ColumnRef, Example, Label, Prompt
from quail.schemas import SchemaType, describe

TRUE_SPELLINGS = ("TRUE", " TRUE", "True", " True")
FALSE_SPELLINGS = ("FALSE", " FALSE", "False", " False")
DOCUMENT_PLACEHOLDER = "the document"
DOCUMENT_LABEL = "DOCUMENT:\n"

ExamplesLayout = Literal["examples_first", "document_first", "instruction_first"]
"""Where a call's shared text goes. `document_first`: the question (and any few-shot examples) after the document,
in its tail — the document's KV then serves every question. `examples_first`: the examples before the document, in
the preamble every document of the call shares (computed once per query). `instruction_first`: a node that asks
each document one question puts the question too (and its examples) in that preamble, and only a short answer cue
after the document — what a long instruction over short documents wants."""
INSTRUCTION_HEADER = "QUESTION: "
"""The instruction-first layout says the same words as the document-first one, in another order: no prompt is longer."""


@dataclass(frozen=True)
class PromptStyle:
    """The fixed text around the layout; a chat model wraps it in its user / assistant turn.

    `control_tokens` are the model's control tokens this text spells (chat turn markers): the
    layout encodes each as its vocabulary id and everything else as plain text, so the markers
    are real while the same spellings inside a document or a question stay characters.
    """

    turn_start: str = ""
    cue: str = "\nANSWER:"
    label_prefix: str = " "
    control_tokens: tuple[str, ...] = ()

    @property
    def preamble(self) -> str:
        return self.turn_start + DOCUMENT_LABEL

    @classmethod
    def chat(cls, user_start: str, user_end_assistant_start: str, control_tokens: tuple[str, ...]) -> PromptStyle:
        """The layout inside a chat turn: the document still comes first inside the user turn."""
        return cls(turn_start=user_start, cue=user_end_assistant_start, label_prefix="", control_tokens=control_tokens)


BASE_STYLE = PromptStyle()
QWEN2_CHAT_STYLE = PromptStyle.chat(
    "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
    "<|im_start|>user\n", "<|im_end|>\n<|im_start|>assistant\n", ("<|im_start|>", "<|im_end|>"))
"""Qwen2.5's ChatML turn, with the system turn its template writes when none is given."""
QWEN3_CHAT_STYLE = PromptStyle.chat("<|im_start|>user\n", "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
                                    ("<|im_start|>", "<|im_end|>", "<think>", "</think>"))


# -- text -------------------------------------------------------------------------------------


def _squash(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def question_text(prompt: Prompt, names: dict[int, str]) -> str:
    """The template with each placeholder replaced by the name the layout gives its document.

    Text the user wrote before a lone leading or trailing placeholder moves after the document,
    so the placeholder itself disappears: 'Does the review praise the acting? {0}' asks
    'Does the review praise the acting?' about the document above.
    """
    template = prompt.template
    matches = list(PLACEHOLDER.finditer(template))
    if len(matches) == 1 and len(names) == 1:
        before, after = template[: matches[0].start()], template[matches[0].end():]
        if not before.strip() or not after.strip():
            return _squash(before + " " + after) or "Is the document relevant?"
    return _squash(PLACEHOLDER.sub(lambda m: names[int(m.group(1))], template))


def examples_text(examples: Sequence[Example]) -> str:
    """The demonstrations as text: each example document and the answer it should get."""
    return "".join(f"EXAMPLE {n}:\n{example.text}\nANSWER: {example.answer}\n\n"
                   for n, example in enumerate(examples, start=1))


EXAMPLES_FIRST_HEADER = "EXAMPLES (documents with their answers to the question asked below):\n\n"
EXAMPLES_AFTER_HEADER = "EXAMPLES (other documents with their answers to this question):\n\n"


def _examples_after(prompt: Prompt, layout: ExamplesLayout) -> str:
    """The examples block of a question tail: where the layout puts them after the document."""
    if not prompt.examples or layout == "examples_first":
        return ""
    return EXAMPLES_AFTER_HEADER + examples_text(prompt.examples)


def filter_tail(prompt: Prompt, style: PromptStyle = BASE_STYLE, layout: ExamplesLayout = "document_first") -> str:
    if layout == "instruction_first":
        return f"\n\nAnswer with TRUE or FALSE.{style.cue}"
    question = question_text(prompt, {0: DOCUMENT_PLACEHOLDER})
    shots = _examples_after(prompt, layout)
    if shots:
        return f"\n\nQUESTION: {question}\n{shots}Answer with TRUE or FALSE about the DOCUMENT.{style.cue}"
    return f"\n\nQUESTION: {question}\nAnswer with TRUE or FALSE.{style.cue}"


def classify_question(prompt: Prompt, instructions: str | None) -> str:
    if prompt.template.strip() == "{0}":
        return instructions or "Which category fits the document best?"
    question = question_text(prompt, {0: DOCUMENT_PLACEHOLDER})
    return f"{instructions} {question}" if instructions else question


def classify_tail(prompt: Prompt, labels: Sequence[Label], instructions: str | None,
                  style: PromptStyle = BASE_STYLE, layout: ExamplesLayout = "document_first") -> str:
    options = "; ".join(f"{label.name} ({label.description})" if label.description else label.name
                        for label in labels)
    if layout == "instruction_first":
        return f"\n\nAnswer with one of: {options}.{style.cue}"
    question = classify_question(prompt, instructions)
    shots = _examples_after(prompt, layout)
    about = " about the DOCUMENT" if shots else ""
    return f"\n\nQUESTION: {question}\n{shots}Answer with one of{about}: {options}.{style.cue}"


def join_frame(prompt: Prompt, anchor: str) -> str:
    names = _join_names(prompt, anchor)
    task = _squash(PLACEHOLDER.sub(lambda m: names[int(m.group(1))], prompt.template))
    return f"\n\nThe document above is DOCUMENT 0.\nTASK: {task}\nAnswer with TRUE or FALSE."


def _join_names(prompt: Prompt, anchor: str) -> dict[int, str]:
    numbers = {}
    partner = 0
    for index, column in enumerate(prompt.columns):
        if column.alias == anchor:
            numbers[index] = "DOCUMENT 0"
        else:
            partner += 1
            numbers[index] = f"DOCUMENT {partner}"
    return numbers


def partner_label(number: int) -> str:
    return f"\n\nDOCUMENT {number}:\n"


# -- tokens -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class AnswerTokens:
    """The first token of each TRUE-like and FALSE-like spelling, deduplicated."""

    true_ids: TokenIds
    false_ids: TokenIds


def answer_tokens(tokenizer: Tokenizer) -> AnswerTokens:
    true_ids = _first_tokens(tokenizer, TRUE_SPELLINGS)
    false_ids = _first_tokens(tokenizer, FALSE_SPELLINGS)
    shared = set(true_ids) & set(false_ids)
    if shared:
        raise RefusalError(Refusal(
            "the tokenizer cannot tell TRUE from FALSE by their first token",
            (f"shared first token ids: {sorted(shared)}",),
        ))
    return AnswerTokens(true_ids, false_ids)


def _first_tokens(tokenizer: Tokenizer, spellings: Sequence[str]) -> TokenIds:
    ids: list[int] = []
    for spelling in spellings:
        encoded = tokenizer.encode(spelling)
        if encoded and encoded[0] not in ids:
            ids.append(encoded[0])
    return tuple(ids)


CONTENT_FREE = ("N/A", "", "[MASK]")
"""Documents that say nothing: a base model's margin on them is its bias for a question."""


def style_ids(tokenizer: Tokenizer, text: str, style: PromptStyle) -> TokenIds:
    """Ids of the style's own text (preamble, answer cue): its control tokens by id, the rest plain.

    The text between two control tokens is encoded alone, as a tokenizer that parses special
    tokens would split it, so the ids equal that tokenizer's.
    """
    if not style.control_tokens:
        return tuple(tokenizer.encode(text))
    ids: list[int] = []
    pattern = "(" + "|".join(re.escape(token) for token in style.control_tokens) + ")"
    for piece in re.split(pattern, text):
        if piece in style.control_tokens:
            ids.append(_control_id(tokenizer, piece))
        elif piece:
            ids.extend(tokenizer.encode(piece))
    return tuple(ids)


def tail_ids(tokenizer: Tokenizer, tail: str, style: PromptStyle) -> TokenIds:
    """Ids of a question tail: the question as plain text — whatever the user's words spell — then the cue.

    A style without control tokens encodes the tail as one string, the ids its models have always seen.
    """
    if not style.control_tokens or not tail.endswith(style.cue):
        return tuple(tokenizer.encode(tail))
    return tuple(tokenizer.encode(tail.removesuffix(style.cue))) + style_ids(tokenizer, style.cue, style)


def _control_id(tokenizer: Tokenizer, token: str) -> int:
    found = tokenizer.token_id(token)
    if found is None:
        raise RefusalError(Refusal(
            f"the tokenizer has no control token {token!r}, which the model's chat layout needs",
            (f"tokenizer {tokenizer.identity!r} does not list it as one vocabulary entry",),
            hints=("use the tokenizer.json that ships with the checkpoint",),
        ))
    return found


def content_free_documents(tokenizer: Tokenizer) -> tuple[TokenIds, ...]:
    """The content-free documents, tokenized as documents are (calibration puts them in the document slot)."""
    return tuple(tuple(tokenizer.encode(text)) for text in CONTENT_FREE)


def preamble_ids(tokenizer: Tokenizer, style: PromptStyle, examples: Sequence[Example] = (),
                 question: str | None = None) -> TokenIds:
    """[BOS][the style's turn start]DOCUMENT: — with the `question` (the instruction-first layout) and `examples`
    (instruction- or examples-first) between the turn start and the document's label, as plain text whatever
    they spell."""
    bos = () if tokenizer.bos_id is None else (tokenizer.bos_id,)
    if not examples and question is None:
        return bos + style_ids(tokenizer, style.preamble, style)
    turn = style_ids(tokenizer, style.turn_start, style) if style.turn_start else ()
    return bos + turn + tuple(tokenizer.encode(instruction_text(question) + (
        EXAMPLES_FIRST_HEADER + examples_text(examples) if examples else "") + DOCUMENT_LABEL))


def instruction_text(question: str | None) -> str:
    """The question as the instruction-first layout states it before the document ("" for none)."""
    return f"{INSTRUCTION_HEADER}{question}\n" if question is not None else ""


def shared_examples(prompts: Sequence[Prompt]) -> tuple[Example, ...] | None:
    """The one set of examples every prompt carries, which the examples-first layout can put in their shared
    preamble; None when they carry none or differ."""
    sets = {prompt.examples for prompt in prompts}
    if len(sets) != 1:
        return None
    [examples] = sets
    return examples or None


def shared_frame(sequences: Sequence[TokenIds]) -> TokenIds:
    """The frame of several question tails: their longest common prefix, shortened so every tail keeps at
    least one token of its own (its question)."""
    if not sequences:
        return ()
    length = min(len(s) for s in sequences) - 1
    for position in range(max(length, 0)):
        token = sequences[0][position]
        if any(s[position] != token for s in sequences[1:]):
            return sequences[0][:position]
    return sequences[0][: max(length, 0)]


def filter_prompt(preamble: TokenIds, document: TokenIds, frame: TokenIds, question: TokenIds) -> TokenIds:
    """The layout of a filter (or score) prompt: [preamble][document][frame][question tail]."""
    return preamble + document + frame + question


def join_prompt(preamble: TokenIds, anchor: TokenIds, frame: TokenIds, labels: Sequence[TokenIds],
                partners: Sequence[TokenIds], cue: TokenIds) -> TokenIds:
    """The layout of a join prompt: [preamble][anchor document][frame] then Σ [label j][partner j], [cue]."""
    if len(partners) != len(labels):
        raise ValueError(f"{len(partners)} partner documents for {len(labels)} partner slots")
    return preamble + anchor + frame + sum((label + doc for label, doc in zip(labels, partners, strict=True)), ()) + cue


@dataclass(frozen=True)
class FilterPrompts:
    """The parts of every stage of one alias's filters (the AiFilter node lays them out)."""

    alias: str
    column: ColumnRef
    preamble: TokenIds
    frame: TokenIds
    questions: tuple[TokenIds, ...]


def bind_filters(predicates: Sequence[AiPredicate], tokenizer: Tokenizer,
                 style: PromptStyle = BASE_STYLE, layout: ExamplesLayout = "document_first") -> FilterPrompts:
    """Stages over one alias, in the given order; the shared frame is written once after the document. The
    examples-first layout needs the one set of examples every stage carries (`shared_examples`)."""
    if not predicates:
        raise ValueError("bind_filters needs at least one predicate")
    columns = {p.prompt.columns[0] for p in predicates}
    if len(columns) != 1 or any(len(p.prompt.columns) != 1 for p in predicates):
        raise ValueError(f"filter stages must read one document column, got {sorted(map(str, columns))}")
    if layout == "instruction_first" and len(predicates) != 1:
        raise ValueError("the instruction-first layout is for a node that asks one question")
    tails = [tail_ids(tokenizer, filter_tail(p.prompt, style, layout), style) for p in predicates]
    frame = shared_frame(tails)
    column = next(iter(columns))
    question = question_text(predicates[0].prompt, {0: DOCUMENT_PLACEHOLDER})
    return FilterPrompts(column.alias, column, _layout_preamble([p.prompt for p in predicates], tokenizer, style,
                                                                 layout, question),
                         frame, tuple(t[len(frame):] for t in tails))


def _layout_preamble(prompts: Sequence[Prompt], tokenizer: Tokenizer, style: PromptStyle,
                     layout: ExamplesLayout, question: str) -> TokenIds:
    if layout == "document_first":
        return preamble_ids(tokenizer, style)
    if layout == "instruction_first":
        return preamble_ids(tokenizer, style, prompts[0].examples, question)
    examples = shared_examples(prompts)
    if examples is None:
        raise ValueError("the examples-first layout needs the same examples on every prompt of the node")
    return preamble_ids(tokenizer, style, examples)


@dataclass(frozen=True)
class JoinPrompt:
    """The parts of a join prompt (the AiJoin node lays them out): preamble, frame, partner labels, cue."""

    anchor: ColumnRef
    partners: tuple[ColumnRef, ...]
    preamble: TokenIds
    frame: TokenIds
    labels: tuple[TokenIds, ...]
    cue: TokenIds


def bind_join(predicate: AiPredicate, anchor: str, tokenizer: Tokenizer,
              style: PromptStyle = BASE_STYLE) -> JoinPrompt:
    if anchor not in predicate.aliases:
        raise ValueError(f"anchor {anchor!r} is not one of the predicate's aliases {predicate.aliases}")
    columns = predicate.prompt.columns
    anchor_column = next(c for c in columns if c.alias == anchor)
    partners = tuple(c for c in columns if c.alias != anchor)
    labels = tuple(tuple(tokenizer.encode(partner_label(n + 1))) for n in range(len(partners)))
    return JoinPrompt(anchor_column, partners, preamble_ids(tokenizer, style),
                      tuple(tokenizer.encode(join_frame(predicate.prompt, anchor))), labels,
                      style_ids(tokenizer, style.cue, style))


@dataclass(frozen=True)
class ClassifyPrompt:
    """The parts of a classification prompt (the AiClassify node lays them out); label k scores labels[k]."""

    column: ColumnRef
    preamble: TokenIds
    tail: TokenIds
    labels: tuple[TokenIds, ...]


def bind_classify(prompt: Prompt, labels: Sequence[Label], instructions: str | None, tokenizer: Tokenizer,
                  style: PromptStyle = BASE_STYLE, layout: ExamplesLayout = "document_first") -> ClassifyPrompt:
    label_ids = tuple(tuple(tokenizer.encode(style.label_prefix + label.name)) for label in labels)
    empty = [label.name for label, ids in zip(labels, label_ids, strict=True) if not ids]
    if empty:
        raise ValueError(f"labels {empty} tokenize to nothing")
    tail = classify_tail(prompt, labels, instructions, style, layout)
    return ClassifyPrompt(prompt.columns[0], _layout_preamble([prompt], tokenizer, style, layout,
                                                              classify_question(prompt, instructions)),
                          tail_ids(tokenizer, tail, style), label_ids)


END_SPELLINGS = ("<|im_end|>", "<|endoftext|>", "<end_of_turn>", "<eos>", "</s>", "<|end|>", "<|eot_id|>")
"""End-of-text and end-of-turn tokens: a generation stops at the first one the model writes (those that are one
vocabulary entry of the tokenizer)."""
INSTRUCTION_LABEL = "INSTRUCTION: "


def generate_tail(prompt: Prompt, style: PromptStyle = BASE_STYLE, schema: SchemaType | None = None) -> str:
    """After the document: the user's instruction (and the fields a structured answer has), then the answer cue the
    model continues from."""
    fields = f"\nAnswer with a JSON object with these fields: {describe(schema)}." if schema is not None else ""
    if prompt.template.strip() == "{0}":  # the column is the whole prompt (AI_COMPLETE('m', r.prompt)): no instruction
        return f"\n\n{fields.strip()}{style.cue}" if fields else style.cue
    return f"\n\n{INSTRUCTION_LABEL}{question_text(prompt, {0: DOCUMENT_PLACEHOLDER})}{fields}{style.cue}"


@dataclass(frozen=True)
class GeneratePrompt:
    """The parts of a generation prompt (the AiGenerate node lays them out): [preamble][document][tail], then
    the model's own tokens until one of `stop` or the token bound."""

    column: ColumnRef
    preamble: TokenIds
    tail: TokenIds
    stop: TokenIds


def bind_generate(prompt: Prompt, tokenizer: Tokenizer, style: PromptStyle = BASE_STYLE,
                  schema: SchemaType | None = None) -> GeneratePrompt:
    stop = tuple(dict.fromkeys(i for i in (tokenizer.token_id(s) for s in END_SPELLINGS) if i is not None))
    if not stop:
        raise RefusalError(Refusal(
            "the tokenizer has no end-of-text token, so a generation could not tell where it ends",
            (f"tokenizer {tokenizer.identity!r} lists none of {', '.join(END_SPELLINGS)}",),
            hints=("use the tokenizer.json that ships with the checkpoint",)))
    return GeneratePrompt(prompt.columns[0], preamble_ids(tokenizer, style),
                          tail_ids(tokenizer, generate_tail(prompt, style, schema), style), stop)


def style_for(chat_template: bool, architecture: str) -> PromptStyle:
    """The layout style of a model: its chat turn when it has a chat template, else the base one."""
    if not chat_template:
        return BASE_STYLE
    return {"qwen2": QWEN2_CHAT_STYLE, "qwen3": QWEN3_CHAT_STYLE}.get(architecture, BASE_STYLE)
