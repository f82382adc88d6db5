"""Few-shot examples: `{'examples': [('a document', TRUE), ...]}` on AI_FILTER / AI.IF / AI.SCORE and
`[('a document', 'label'), ...]` on AI.CLASSIFY — read, refused where wrong (naming what), laid out where the
planner finds them cheaper (first, in the preamble every document shares; or after each document), and said so in
explain(). The native executor's answers over both layouts are checked against transformers in test_exactness.py.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from test_general_rule import keyword_session

import quail
from quail.logical.expressions import AiPredicate, ColumnRef, Example, Label, Prompt
from quail.physical import nodes as ph
from quail.prompts import QWEN2_CHAT_STYLE, bind_classify, bind_filters
from quail.testing.tokenizer import ByteTokenizer

SHOTS = "{'examples': [('The cast is superb.', TRUE), ('The music drags.', FALSE)]}"
BODY = ColumnRef("r", "body")


@pytest.fixture(scope="module")
def session() -> Iterator[quail.Session]:
    with keyword_session() as opened:
        yield opened


def model_nodes(query: quail.Query) -> list[ph.PhysicalNode]:
    return [n for n in query.plan().graph.nodes if isinstance(n, ph.AiFilter | ph.AiScore | ph.AiClassify)]


def decoded(ids: tuple[int, ...]) -> str:
    return ByteTokenizer().decode(ids)


@pytest.mark.parametrize("dialect", ["snowflake", "bigquery"])
def test_examples_reach_the_prompt_of_a_filter_a_score_and_a_classification(session, dialect):
    filter_call = "AI_FILTER" if dialect == "snowflake" else "AI.IF"
    sql = (f"SELECT r.id, AI.SCORE(PROMPT('Is {{0}} positive?', r.body), {SHOTS}) AS s, "
           "AI.CLASSIFY(r.body, ['acting', 'music'], {'examples': [('The cast is superb.', 'acting')]}) AS k "
           f"FROM reviews r WHERE {filter_call}(PROMPT('Does {{0}} praise the acting?', r.body), {SHOTS})")
    query = session.sql(sql, dialect=dialect)
    texts = []
    for node in model_nodes(query):
        assert isinstance(node, ph.AiFilter | ph.AiScore | ph.AiClassify)
        tail = node.frame + node.stages[0].question if isinstance(node, ph.AiFilter) else (
            node.question if isinstance(node, ph.AiScore) else node.tail)
        texts.append(decoded(node.preamble + tail))
    assert len(texts) == 3
    assert all("EXAMPLE 1:\nThe cast is superb.\nANSWER: " in text for text in texts)
    assert sum("ANSWER: acting" in text for text in texts) == 1
    assert query.run().collect().column_names == ["id", "s", "k"]


@pytest.mark.parametrize(("options", "message"), [
    ("{'examples': [('a', 'yes')]}", "the answer of an example is TRUE or FALSE"),
    ("{'examples': [('a', TRUE, 1)]}", "an example is ('a document', TRUE)"),
    ("{'examples': [(r.body, TRUE)]}", "an example is ('a document', TRUE)"),
    ("{'examples': []}", "write 'examples': [('a document', TRUE), ...]"),
    ("{'examples': 'a'}", "write 'examples': [('a document', TRUE), ...]"),
    ("{'examples': [" + ", ".join(["('a', TRUE)"] * 33) + "]}", "a call takes at most 32"),
])
def test_malformed_examples_are_refused_naming_what(session, options, message):
    with pytest.raises(quail.CompileError, match=message.replace("(", r"\(").replace(")", r"\)")
                       .replace("[", r"\[").replace("]", r"\]").replace(".", r"\.")):
        session.sql(f"SELECT r.id FROM reviews r WHERE AI_FILTER(PROMPT('Is {{0}} good?', r.body), {options})")


def test_an_example_label_must_be_one_of_the_labels(session):
    with pytest.raises(quail.CompileError, match=r"example label 'plot' is not one of the labels 'acting', 'music'"):
        session.sql("SELECT AI.CLASSIFY(r.body, ['acting', 'music'], {'examples': [('x', 'plot')]}) AS k "
                    "FROM reviews r")


def test_examples_on_a_join_are_refused(session):
    with pytest.raises(quail.CompileError, match="examples are given for a prompt over one document"):
        session.sql(f"SELECT r.id, a.aspect FROM reviews r JOIN aspects a "
                    f"ON AI_FILTER(PROMPT('Does {{0}} discuss {{1}}?', r.body, a.aspect), {SHOTS})")


def test_snowflake_objects_spell_examples_too(session):
    objects = ("{'examples': [{'input': 'The cast is superb.', 'output': TRUE}, "
               "{'input': 'The music drags.', 'output': FALSE}]}")
    plain = session.sql(f"SELECT r.id FROM reviews r WHERE AI_FILTER(PROMPT('Is {{0}} good?', r.body), {SHOTS})")
    spelled = session.sql(f"SELECT r.id FROM reviews r WHERE AI_FILTER(PROMPT('Is {{0}} good?', r.body), {objects})")
    assert [n.preamble for n in model_nodes(plain)] == [n.preamble for n in model_nodes(spelled)]
    labelled = session.sql("SELECT AI_CLASSIFY(r.body, ['acting', 'music'], {'examples': "
                           "[{'input': 'The cast is superb.', 'labels': ['acting']}]}) AS k FROM reviews r")
    assert "ANSWER: acting" in decoded(model_nodes(labelled)[0].preamble)


def test_shared_examples_go_first_once_and_different_ones_after_each_document(session):
    shared = session.sql(f"SELECT r.id FROM reviews r WHERE AI_FILTER(PROMPT('Is {{0}} good?', r.body), {SHOTS}) "
                         f"AND AI_FILTER(PROMPT('Is {{0}} long?', r.body), {SHOTS})")
    [node] = model_nodes(shared)
    assert isinstance(node, ph.AiFilter) and "EXAMPLE 2:" in decoded(node.preamble)
    assert "examples of the filters on r: first" in shared.explain()
    different = session.sql(f"SELECT r.id FROM reviews r WHERE AI_FILTER(PROMPT('Is {{0}} good?', r.body), {SHOTS}) "
                            "AND AI_FILTER(PROMPT('Is {0} long?', r.body))")
    [node] = model_nodes(different)
    assert isinstance(node, ph.AiFilter) and "EXAMPLE" not in decoded(node.preamble)
    assert sum("EXAMPLE 1:" in decoded(node.frame + stage.question) for stage in node.stages) == 1
    assert "after each document (its questions carry different examples" in different.explain()


def test_the_planner_weighs_both_layouts_by_tokens(session):
    """One document: the examples cost as much after it as first, and first has the longer header; many: first."""
    one = session.sql(f"SELECT r.id FROM reviews r WHERE r.id = 1 AND "
                      f"AI_FILTER(PROMPT('Is {{0}} good?', r.body), {SHOTS})")
    many = session.sql(f"SELECT r.id FROM reviews r WHERE AI_FILTER(PROMPT('Is {{0}} good?', r.body), {SHOTS})")
    assert "examples of the filters on r: after each document — first:" in one.explain()
    assert "examples of the filters on r: first, a prefix every document shares — first:" in many.explain()
    for query in (one, many):
        [node] = model_nodes(query)
        assert isinstance(node, ph.AiFilter)
        assert ("EXAMPLE 1:" in decoded(node.preamble)) == (query is many)


def test_examples_first_keep_the_chat_turn_and_their_text_plain():
    """In a chat layout the examples sit inside the user turn, after its start; a control token's spelling inside an
    example stays characters (it cannot end the turn)."""
    class Chat(ByteTokenizer):
        def token_id(self, token: str) -> int | None:
            return {"<|im_start|>": 1000, "<|im_end|>": 1001}.get(token, super().token_id(token))

    tokenizer = Chat()
    prompt = Prompt("Is {0} good?", (BODY,), (Example("fine <|im_end|> film", "TRUE"),))
    bound = bind_filters([AiPredicate(prompt, 0)], tokenizer, QWEN2_CHAT_STYLE, "examples_first")
    assert bound.preamble.count(1000) == 2 and bound.preamble.count(1001) == 1  # system turn, user turn start
    plain = tokenizer.encode("fine <|im_end|> film")
    start = _find(bound.preamble, tokenizer.encode("fine"))
    assert list(bound.preamble[start:start + len(plain)]) == plain
    classified = bind_classify(Prompt("{0}", (BODY,), (Example("x <|im_start|> y", "a"),)), [Label("a"), Label("b")],
                               None, tokenizer, QWEN2_CHAT_STYLE, "document_first")
    assert "x <|im_start|> y" in tokenizer.decode([i for i in classified.tail if i < 1000])
    assert classified.tail.count(1000) == 1 and classified.tail.count(1001) == 1  # the cue's, only


def _find(ids: tuple[int, ...], part: list[int]) -> int:
    for start in range(len(ids)):
        if list(ids[start:start + len(part)]) == part:
            return start
    raise AssertionError("not found")


def test_the_minimum_counts_the_shared_preamble_once(session):
    """With the examples first, the least a perfect executor computes grows by exactly the examples' tokens: the
    documents and question tails are those of the same filter without them."""
    sql = "SELECT r.id FROM reviews r WHERE AI_FILTER(PROMPT('Is {0} good?', r.body)OPTIONS)"
    plain, shots = (session.sql(sql.replace("OPTIONS", options)) for options in ("", f", {SHOTS}"))
    [plain_node], [shots_node] = model_nodes(plain), model_nodes(shots)
    assert isinstance(plain_node, ph.AiFilter) and isinstance(shots_node, ph.AiFilter)
    assert (plain_node.frame, plain_node.stages[0].question) == (shots_node.frame, shots_node.stages[0].question)
    extra = len(shots_node.preamble) - len(plain_node.preamble)
    assert extra > 40
    assert shots.run().report["minimum_tokens"] - plain.run().report["minimum_tokens"] == extra


def test_the_same_words_with_other_examples_are_another_question(session):
    """Calls that differ only in their examples are answered apart, and a WHERE filter with examples does not make
    the same filter without them TRUE."""
    other = "{'examples': [('Dreadful.', TRUE)]}"
    scores = session.sql(f"SELECT r.id, AI.SCORE(PROMPT('Is {{0}} good?', r.body), {SHOTS}) AS a, "
                         f"AI.SCORE(PROMPT('Is {{0}} good?', r.body), {other}) AS b, "
                         "AI.SCORE(PROMPT('Is {0} good?', r.body)) AS c FROM reviews r")
    assert len([n for n in model_nodes(scores) if isinstance(n, ph.AiScore)]) == 3
    verdict = session.sql("SELECT r.id, AI_FILTER(PROMPT('Is {0} good?', r.body)) AS plain FROM reviews r "
                          f"WHERE AI_FILTER(PROMPT('Is {{0}} good?', r.body), {SHOTS})")
    assert len(model_nodes(verdict)) == 2, "the SELECT value is asked without the examples"


def test_a_plan_with_examples_crosses_a_process_boundary_as_data():
    from quail.physical.codecs import decode_graph, encode_graph

    with keyword_session() as opened:
        graph = opened.sql(f"SELECT r.id FROM reviews r WHERE AI_FILTER(PROMPT('Is {{0}} good?', r.body), {SHOTS})"
                           ).plan().graph
    assert decode_graph(encode_graph(graph)) == graph
    [node] = [n for n in graph.nodes if isinstance(n, ph.AiFilter)]
    assert node.stages[0].predicate.prompt.examples == (Example("The cast is superb.", "TRUE"),
                                                         Example("The music drags.", "FALSE"))


def test_documents_after_another_preamble_count_again_in_the_minimum(session):
    """A score after an examples-first filter reads the survivors after a different preamble: the least a perfect
    executor computes holds those documents twice."""
    where = f"FROM reviews r WHERE AI_FILTER(PROMPT('Is {{0}} good?', r.body), {SHOTS})"
    alone = session.sql(f"SELECT r.id {where}").run()
    both = session.sql(f"SELECT r.id, AI.SCORE(PROMPT('Is {{0}} long?', r.body)) AS s {where}").run()
    [score] = [n for n in model_nodes(session.sql(f"SELECT r.id, AI.SCORE(PROMPT('Is {{0}} long?', r.body)) AS s "
                                                  f"{where}")) if isinstance(n, ph.AiScore)]
    survivors = both.answer_tables[score.id].num_rows
    assert survivors > 0
    without_documents = alone.report["minimum_tokens"] + len(score.preamble) + survivors * len(score.question)
    assert both.report["minimum_tokens"] > without_documents


def test_the_answer_store_prices_examples_as_the_plan_lays_them_out(tmp_path):
    """Answers stored under the examples-first layout are the ones the planner finds when it prices the repeat."""
    sql = f"SELECT r.id FROM reviews r WHERE AI_FILTER(PROMPT('Is {{0}} good?', r.body), {SHOTS})"
    with keyword_session(tmp_path / "answers.sqlite") as opened:
        first = opened.sql(sql)
        assert "examples of the filters on r: first" in first.explain()
        first.run()
        again = opened.sql(sql).explain()
    assert "answer store: of" in again and "still to compute #0 0" in again


def test_a_filter_whose_examples_go_first_keeps_no_kv_for_the_join(session):
    """The documents' KV would hold the examples, which the join's prompt does not: nothing is kept, and the plan
    says the examples' first place was priced with those documents computed again."""
    query = session.sql("SELECT r.id, a.aspect FROM reviews r JOIN aspects a "
                        "ON AI_FILTER(PROMPT('Does {0} discuss {1}?', r.body, a.aspect)) "
                        f"WHERE AI_FILTER(PROMPT('Is {{0}} good?', r.body), {SHOTS})")
    [node] = [n for n in query.plan().graph.nodes if isinstance(n, ph.AiFilter)]
    text = query.explain()
    assert "examples of the filters on r: first" in text and "of documents another node would reuse" in text
    assert not node.retain_kv and "keep the document KV of r" not in text


@pytest.mark.parametrize("call", ["AI_FILTER(PROMPT('Is {0} good?', r.body), OPTIONS)",
                                  "AI.SCORE(PROMPT('Is {0} good?', r.body), OPTIONS) > 0.5"])
def test_examples_longer_than_a_forward_pass_are_refused_naming_them(call):
    """Skipping or cutting documents could not help: the refusal names the examples and what to change."""
    long = "word " * 2500
    options = "{'examples': [('" + long + "', TRUE), ('short', FALSE)]}"
    with keyword_session() as opened, pytest.raises(quail.RefusalError) as refused:
        opened.sql(f"SELECT r.id FROM reviews r WHERE {call.replace('OPTIONS', options)}").plan()
    message = str(refused.value)
    assert "the examples of the prompts over r leave no room for a document" in message
    assert "2 examples and the question take" in message and "give fewer or shorter examples" in message
