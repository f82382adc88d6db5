"""Prompt binding: the document-first layout, per-part tokenization, frames and answer tokens."""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import pytest
from support.prompt_nodes import filter_node, join_node

from quail import RefusalError
from quail.logical.expressions import AiPredicate, ColumnRef, Label, Prompt
from quail.prompts import (
    BASE_STYLE,
    QWEN3_CHAT_STYLE,
    answer_tokens,
    bind_classify,
    bind_filters,
    bind_join,
    filter_tail,
    question_text,
    shared_frame,
    style_for,
)

BODY = ColumnRef("r", "body")
ASPECT = ColumnRef("a", "aspect")


CONTROL_TOKENS = ("<|im_start|>", "<|im_end|>", "<think>", "</think>")
CONTROL_BASE = 0x110000  # past every character


class CharTokenizer:
    """One token per character: easy to decode, and it shows where each part starts.

    Its vocabulary also holds Qwen3's chat markers as control tokens, which `encode` never produces.
    """

    identity = "chars"
    bos_id = 0

    def encode(self, text: str) -> list[int]:
        return [ord(ch) for ch in text]

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(CONTROL_TOKENS[i - CONTROL_BASE] if i >= CONTROL_BASE else chr(i) for i in ids if i)

    def token_id(self, token: str) -> int | None:
        if token in CONTROL_TOKENS:
            return CONTROL_BASE + CONTROL_TOKENS.index(token)
        return ord(token) if len(token) == 1 else None


class WordTokenizer(CharTokenizer):
    """Tokenizes whole strings differently from their parts, like BPE merges do."""

    def encode(self, text: str) -> list[int]:
        return [zlib.crc32(text.encode()) % 100_000 + 1]


def predicate(template: str, *columns: ColumnRef, position: int = 0) -> AiPredicate:
    return AiPredicate(Prompt(template, columns), position)


def test_text_before_the_document_moves_after_it():
    prompt = Prompt("Does the review praise the acting? {0}", (BODY,))
    assert question_text(prompt, {0: "the document"}) == "Does the review praise the acting?"
    tail = filter_tail(prompt)
    assert tail.startswith("\n\nQUESTION: Does the review praise the acting?")
    assert tail.endswith(BASE_STYLE.cue)


def test_a_placeholder_in_mid_sentence_names_the_document():
    prompt = Prompt("Is {0} about cats?", (BODY,))
    assert question_text(prompt, {0: "the document"}) == "Is the document about cats?"


def test_filter_prompt_is_preamble_document_frame_question():
    tokenizer = CharTokenizer()
    node = filter_node([predicate("Is {0} positive?", BODY)], tokenizer)
    document = tuple(tokenizer.encode("great film"))
    text = tokenizer.decode(node.prompt(document, 0))
    assert text.startswith("DOCUMENT:\ngreat film\n\nQUESTION: Is the document positive?")
    assert text.endswith("ANSWER:")
    assert node.prompt(document, 0)[0] == tokenizer.bos_id


def test_parts_are_tokenized_separately_and_concatenated():
    tokenizer = WordTokenizer()
    stages = bind_filters([predicate("Is {0} positive?", BODY)], tokenizer)
    document = (7, 8, 9)
    full = filter_node([predicate("Is {0} positive?", BODY)], tokenizer).prompt(document, 0)
    assert full == stages.preamble + document + stages.frame + stages.questions[0]
    assert stages.preamble == (0, *tokenizer.encode("DOCUMENT:\n"))


def test_filters_on_one_alias_share_their_longest_common_tail_prefix_as_frame():
    tokenizer = CharTokenizer()
    both = [predicate("Is {0} positive?", BODY), predicate("Is {0} long?", BODY, position=1)]
    stages = bind_filters(both, tokenizer)
    assert tokenizer.decode(stages.frame) == "\n\nQUESTION: Is the document "
    assert [tokenizer.decode(q)[:4] for q in stages.questions] == ["posi", "long"]
    together = filter_node(both, tokenizer)
    for stage, template in enumerate(["Is {0} positive?", "Is {0} long?"]):
        alone = filter_node([predicate(template, BODY)], tokenizer)
        assert together.prompt((5,), stage) == alone.prompt((5,), 0)


def test_every_question_keeps_at_least_one_token():
    assert shared_frame([(1, 2, 3), (1, 2, 3)]) == (1, 2)
    assert shared_frame([(1, 2), (1, 2, 3)]) == (1,)
    assert shared_frame([(4,), (4, 5)]) == ()


def test_filters_over_different_columns_are_refused():
    with pytest.raises(ValueError, match="one document column"):
        bind_filters([predicate("{0}", BODY), predicate("{0}", ColumnRef("r", "title"))], CharTokenizer())


def test_join_prompt_is_anchor_prefix_then_partner_suffix():
    tokenizer = CharTokenizer()
    join = join_node(predicate("Does {0} discuss {1}?", BODY, ASPECT), "r", tokenizer)
    review, aspect = tuple(tokenizer.encode("fine acting")), tuple(tokenizer.encode("acting"))
    text = tokenizer.decode(join.prompt(review, [aspect]))
    assert text.startswith("DOCUMENT:\nfine acting\n\nThe document above is DOCUMENT 0.")
    assert "TASK: Does DOCUMENT 0 discuss DOCUMENT 1?" in text
    assert text.endswith("\n\nDOCUMENT 1:\nacting" + BASE_STYLE.cue)
    assert join.prompt(review, [aspect])[: len(join.anchor_prefix(review))] == join.anchor_prefix(review)


def test_the_anchor_choice_renames_the_documents():
    tokenizer = CharTokenizer()
    join = bind_join(predicate("Does {0} discuss {1}?", BODY, ASPECT), "a", tokenizer)
    assert "TASK: Does DOCUMENT 1 discuss DOCUMENT 0?" in tokenizer.decode(join.frame)
    assert join.anchor == ASPECT and join.partners == (BODY,)


def test_multi_way_join_labels_each_partner():
    tokenizer = CharTokenizer()
    third = ColumnRef("c", "text")
    join = join_node(predicate("Do {0}, {1} and {2} agree?", BODY, ASPECT, third), "a", tokenizer)
    suffix = tokenizer.decode(join.suffix([(ord("x"),), (ord("y"),)]))
    assert suffix == "\n\nDOCUMENT 1:\nx\n\nDOCUMENT 2:\ny" + BASE_STYLE.cue
    with pytest.raises(ValueError, match="1 partner documents for 2 partner slots"):
        join.suffix([(1,)])


def test_filter_and_join_share_the_document_prefix_so_its_kv_can_be_reused():
    tokenizer = WordTokenizer()
    document = (11, 12)
    stages = filter_node([predicate("Is {0} positive?", BODY)], tokenizer)
    join = join_node(predicate("Does {0} discuss {1}?", BODY, ASPECT), "r", tokenizer)
    assert stages.prompt(document, 0)[: len(stages.preamble) + 2] == join.anchor_prefix(document)[
        : len(join.preamble) + 2]


def test_classify_lists_labels_and_scores_their_continuations():
    tokenizer = CharTokenizer()
    labels = (Label("positive", "likes it"), Label("negative"))
    bound = bind_classify(Prompt("{0}", (BODY,)), labels, None, tokenizer)
    tail = tokenizer.decode(bound.tail)
    assert "Answer with one of: positive (likes it); negative." in tail
    assert [tokenizer.decode(ids) for ids in bound.labels] == [" positive", " negative"]


def test_chat_models_wrap_the_layout_with_the_document_first_in_the_user_turn():
    tokenizer = CharTokenizer()
    node = filter_node([predicate("Is {0} positive?", BODY)], tokenizer, QWEN3_CHAT_STYLE)
    text = tokenizer.decode(node.prompt(tuple(tokenizer.encode("doc")), 0))
    assert text.startswith("<|im_start|>user\nDOCUMENT:\ndoc\n\nQUESTION:")
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert node.preamble[1] == tokenizer.token_id("<|im_start|>")  # the marker is the control token itself
    assert style_for(True, "qwen3") is QWEN3_CHAT_STYLE and style_for(False, "gemma3") is BASE_STYLE


def test_answer_tokens_are_the_first_tokens_of_each_spelling():
    tokens = answer_tokens(WordTokenizer())
    assert len(tokens.true_ids) == 4 and len(tokens.false_ids) == 4
    with pytest.raises(RefusalError, match=r"shared first token ids: \[32\]"):
        answer_tokens(CharTokenizer())  # " TRUE" and " FALSE" both start with a space


def test_tokenizer_that_cannot_tell_true_from_false_is_refused():
    class Shared(CharTokenizer):
        def encode(self, text: str) -> list[int]:
            return [1]

    with pytest.raises(RefusalError, match="cannot tell TRUE from FALSE"):
        answer_tokens(Shared())
