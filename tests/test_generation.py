"""Text out of the model: AI_COMPLETE and AI.GENERATE on the keyword test backend, whose "generation" is a document's
first sentence (`quail.testing.rules.generated_text`): both warehouses' argument forms, the token bound, NULL in →
NULL out, the answer store, and the calls anywhere SQL allows an AI value. The native decoder's tokens are checked
against transformers in packages/quail-native/tests/test_exactness.py."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from support.cases import empty_keyword_session

import quail
from quail.presentation import format_report
from quail.testing import BASE_MODEL, ByteTokenizer
from quail.testing.rules import generated_text

BODIES = ["Great film. The acting by Ann Lee is superb.", None, "A slow, long story! The ending drags.",
          "Great film. The acting by Ann Lee is superb.", "", "No sentence end here"]


WAREHOUSE_MODELS = {name: BASE_MODEL for name in ("m", "llama3.1-8b", "mistral-large2", "claude-4-sonnet",
                                                   "gemini-2.5-flash")}
"""The warehouses' model names the statements here use, each an alias of the session's model."""


def session(cache: str = "off") -> quail.Session:
    opened = empty_keyword_session(cache=cache, model_aliases=WAREHOUSE_MODELS)
    opened.register("r", pa.table({"id": list(range(len(BODIES))), "body": BODIES,
                                   "stars": [5, 3, 2, 4, 1, 3]}))
    return opened


def rows(sql: str, dialect: str = "snowflake", cache: str = "off") -> list[dict]:
    with session(cache) as opened:
        return opened.sql(sql, dialect=dialect).run().to_rows()


def expected(bound: int | None = None) -> list[str | None]:
    """The keyword rule's generation per body, cut at `bound` tokens (bytes for the byte tokenizer)."""
    out = []
    for body in BODIES:
        text = None if body is None else generated_text(body)
        out.append(text if text is None or bound is None else text.encode()[:bound].decode().strip())
    return out


@pytest.mark.parametrize(("dialect", "call"), [
    ("snowflake", "AI_COMPLETE('llama3.1-8b', CONCAT('Summarize: ', r.body))"),
    ("snowflake", "AI_COMPLETE('llama3.1-8b', 'Summarize: ' || r.body)"),
    ("snowflake", "AI_COMPLETE(model => 'mistral-large2', prompt => PROMPT('Summarize {0}', r.body))"),
    ("snowflake", "AI_COMPLETE('claude-4-sonnet', PROMPT('Summarize {0}', r.body), {'temperature': 0})"),
    ("bigquery", "AI.GENERATE(('Summarize ', r.body)).result"),
    ("bigquery", "AI.GENERATE(prompt => ('Summarize ', r.body), connection_id => 'us.conn').result"),
    ("bigquery", "AI.GENERATE(PROMPT('Summarize {0}', r.body), endpoint => 'gemini-2.5-flash').result"),
])
def test_both_warehouses_spellings_generate_each_rows_text_and_null_for_a_null_document(dialect, call):
    found = rows(f"SELECT r.id, {call} AS s FROM r ORDER BY r.id", dialect)
    assert [row["s"] for row in found] == expected()


@pytest.mark.parametrize(("dialect", "call"), [
    ("snowflake", "AI_COMPLETE('m', PROMPT('Summarize {0}', r.body), {'max_tokens': 9})"),
    ("snowflake", "AI_COMPLETE(model => 'm', prompt => r.body, model_parameters => {'max_tokens': 9})"),
    ("bigquery", "AI.GENERATE(('Summarize ', r.body), model_params => JSON '{\"generationConfig\": "
                 "{\"maxOutputTokens\": 9}}').result"),
])
def test_the_token_bound_of_either_warehouse_cuts_a_generation(dialect, call):
    found = rows(f"SELECT r.id, {call} AS s FROM r ORDER BY r.id", dialect)
    assert [row["s"] for row in found] == expected(9)


def test_bigquery_reads_a_struct_with_result_and_an_empty_status():
    [first, second, *_] = rows("SELECT r.id, AI.GENERATE(('Summarize ', r.body)) AS g FROM r ORDER BY r.id",
                               "bigquery")
    assert first["g"] == {"result": expected()[0], "full_response": None, "status": ""}
    assert second["g"]["result"] is None


def test_a_generation_is_a_value_anywhere_sql_allows_one():
    """In WHERE and GROUP BY (the one-block planner), and inside CASE in a CTE (the general rule's lookups)."""
    sql = ("SELECT AI_COMPLETE('m', PROMPT('Summarize {0}', r.body)) AS s, COUNT(*) AS n FROM r "
           "WHERE LENGTH(AI_COMPLETE('m', PROMPT('Summarize {0}', r.body))) > 10 GROUP BY s ORDER BY s")
    assert rows(sql) == [{"s": "A slow, long story!", "n": 1}, {"s": "Great film.", "n": 2},
                         {"s": "No sentence end here", "n": 1}]
    cte = ("WITH t AS (SELECT r.id, CASE WHEN r.stars > 3 THEN AI_COMPLETE('m', PROMPT('Summarize {0}', r.body)) "
           "ELSE 'low' END AS s FROM r) SELECT id, s FROM t ORDER BY id")
    assert [row["s"] for row in rows(cte)] == [expected()[0], "low", "low", expected()[3], "low", "low"]


def test_explain_names_the_model_the_call_asked_for_and_the_bound_it_plans_for():
    with session() as opened:
        query = opened.sql("SELECT r.id, AI_COMPLETE('llama3.1-8b', PROMPT('Summarize {0}', r.body), "
                           "{'max_tokens': 20}) AS s FROM r")
        text = query.explain()
    assert f"AI_COMPLETE: model 'llama3.1-8b' stands for {BASE_MODEL} (EngineConfig.model_aliases)" in text
    assert "AiGenerate #0 r AS s (at most 20 tokens)" in text
    assert "at most 20 tokens each decoded" in text


def test_a_stored_generation_is_never_computed_twice(tmp_path: Path):
    store = str(tmp_path / "answers.sqlite")
    sql = "SELECT r.id, AI_COMPLETE('m', PROMPT('Summarize {0}', r.body)) AS s FROM r ORDER BY r.id"
    with session(store) as opened:
        first = opened.sql(sql).run()
    with session(store) as opened:
        again = opened.sql(sql).run()
        bounded = opened.sql(sql.replace("r.body))", "r.body), {'max_tokens': 4})")).run()
    assert first.to_rows() == again.to_rows() and [r["s"] for r in again.to_rows()] == expected()
    [node] = [n for n, m in first.report["node_metrics"].items() if n.startswith("generate_")]
    assert first.report["node_metrics"][node]["stored_answers"] == 0
    assert again.report["node_metrics"][node]["stored_answers"] == 5, "every row with a document, the empty one too"
    assert again.report["fresh_tokens"] == 0
    assert bounded.report["fresh_tokens"] > 0, "another token bound is another generation"


@pytest.mark.parametrize(("sql", "message"), [
    ("AI_COMPLETE('m', PROMPT('x {0}', r.body), {'temperature': 0.7})", "temperature 0.7: Quail decodes greedily"),
    ("AI_COMPLETE('m', PROMPT('x {0}', r.body), {'max_tokens': 0})", "max_tokens must be a whole number from 1"),
    ("AI_COMPLETE('m', PROMPT('x {0}', r.body), {'max_tokens': 2.5})", "max_tokens must be a whole number"),
    ("AI_COMPLETE('m', PROMPT('x {0}', r.body), {'stop': 'x'})", "option 'stop' is not supported"),
    ("AI_COMPLETE('m', PROMPT('x {0}', r.body), {}, {'type': 'json'})", "names its fields in 'schema'"),
    ("AI_COMPLETE('m')", "AI_COMPLETE has no prompt"),
    ("AI_COMPLETE(model => 'm', model => 'n', prompt => r.body)", "names its model twice"),
])
def test_options_quail_cannot_honour_are_refused_before_any_model_work(sql, message):
    with session() as opened, pytest.raises(quail.CompileError, match=message):
        opened.sql(f"SELECT {sql} FROM r")


# -- structured output -----------------------------------------------------------------------------------------


SCHEMA = "actor STRING, words INT64, share FLOAT64, great BOOL, tags ARRAY<INT64>, more STRUCT<flag BOOL, note STRING>"


def test_every_schema_type_round_trips_through_bigquerys_output_schema():
    [first, second, third, *_] = rows(f"SELECT r.id, AI.GENERATE(('Describe ', r.body), output_schema => '{SCHEMA}') "
                                      "AS g FROM r ORDER BY r.id", "bigquery")
    assert first["g"] == {"actor": "Great film.", "words": 7, "share": 0.7, "great": True, "tags": [7],
                          "more": {"flag": True, "note": "Great film."}, "full_response": None, "status": ""}
    assert second["g"]["actor"] is None
    assert third["g"]["great"] is False and third["g"]["tags"] == [6] and third["g"]["status"] == ""


@pytest.mark.parametrize(("call", "value"), [
    ("AI.GENERATE_BOOL(('Is it great? ', r.body))", True),
    ("AI.GENERATE_INT(prompt => ('How many words? ', r.body), connection_id => 'us.c')", 7),
    ("AI.GENERATE_DOUBLE(('A tenth of its words? ', r.body))", 0.7),
])
def test_bigquerys_typed_generations_read_their_result(call, value):
    found = rows(f"SELECT r.id, {call}.result AS v, {call}.status AS s FROM r ORDER BY r.id", "bigquery")
    assert found[0] == {"id": 0, "v": value, "s": ""} and found[1]["v"] is None


@pytest.mark.parametrize("format_", [
    "{'actor': 'Which actor is named?', 'mood': 'What is the mood?'}",
    "[['actor', 'Which actor is named?'], ['mood', 'What is the mood?']]",
    "{'schema': {'type': 'object', 'properties': {'actor': {'type': 'string'}, 'mood': {'type': 'string'}}}}",
])
def test_snowflakes_ai_extract_answers_response_and_error(format_):
    found = rows(f"SELECT r.id, AI_EXTRACT(text => r.body, responseFormat => {format_}) AS x FROM r ORDER BY r.id")
    assert found[0]["x"] == {"response": {"actor": "Great film.", "mood": "Great film."}, "error": None}
    assert found[1]["x"] == {"response": None, "error": None}


def test_ai_extract_with_questions_alone_keys_each_answer_by_its_question():
    found = rows("SELECT AI_EXTRACT(r.body, ['Which actor?']) AS x FROM r ORDER BY r.id")
    assert found[0]["x"]["response"] == {"Which actor?": "Great film."}


def test_ai_complete_with_a_response_format_answers_the_object_of_fields():
    fmt = "{'type': 'json', 'schema': {'type': 'object', 'properties': {'n': {'type': 'integer'}}}}"
    found = rows(f"SELECT r.id, AI_COMPLETE('m', PROMPT('Count {{0}}', r.body), {{}}, {fmt}) AS x FROM r "
                 "ORDER BY r.id")
    assert [row["x"] for row in found] == [{"n": 7}, None, {"n": 6}, {"n": 7}, {"n": 0}, {"n": 3}]


def test_output_cut_by_the_bound_is_null_with_a_status_saying_why_never_an_error():
    with session() as opened:
        result = opened.sql("SELECT r.id, AI.GENERATE(('Who? ', r.body), output_schema => 'actor STRING', "
                            "model_params => JSON '{\"generationConfig\": {\"maxOutputTokens\": 8}}') AS g FROM r "
                            "ORDER BY r.id", dialect="bigquery").run()
    found = result.to_rows()
    assert found[0]["g"]["actor"] is None and found[0]["g"]["status"].startswith("the output did not parse")
    assert result.report["unparsed"] == {"g": 5}, "every row with a document, the bound cut each"
    assert "g: 5 output(s) did not parse as the schema" in format_report(result.report)
    extracted = rows("SELECT AI_EXTRACT(r.body, {'actor': 'Which actor?'}) AS x FROM r ORDER BY r.id LIMIT 1")
    assert extracted[0]["x"]["error"] is None  # the default bound for structured output holds the whole JSON


def test_a_structured_generation_is_stored_apart_from_the_same_prompt_as_text(tmp_path: Path):
    store = str(tmp_path / "answers.sqlite")
    text = "SELECT AI.GENERATE(('Who? ', r.body)).result AS g FROM r ORDER BY r.id"
    structured = ("SELECT AI.GENERATE(('Who? ', r.body), output_schema => 'actor STRING').actor AS g FROM r "
                  "ORDER BY r.id")
    with session(store) as opened:
        opened.sql(text, dialect="bigquery").run()
        again = opened.sql(structured, dialect="bigquery").run()
    assert again.report["fresh_tokens"] > 0
    assert [r["g"] for r in again.to_rows()] == expected()


@pytest.mark.parametrize(("dialect", "sql", "message"), [
    ("bigquery", "AI.GENERATE(('x ', r.body), output_schema => 'a DATE')", "type DATE is not one of STRING"),
    ("bigquery", "AI.GENERATE(('x ', r.body), output_schema => 'a STRING, a INT64')", "field names must differ"),
    ("bigquery", "AI.GENERATE(('x ', r.body), output_schema => 'status STRING')", "may not be named"),
    ("bigquery", "AI.GENERATE(('x ', r.body), output_schema => 'not a schema at all')", "output schema"),
    ("bigquery", "AI.GENERATE_INT(('x ', r.body), output_schema => 'a STRING')", "returns its own type"),
    ("snowflake", "AI_EXTRACT(file => TO_FILE('@s', 'a.pdf'), responseFormat => ['x'])", r"file => \.\.\.\) is not"),
    ("snowflake", "AI_EXTRACT(r.body, 'Which actor?')", "responseFormat"),
    ("snowflake", "AI_EXTRACT(r.body, {'schema': {'type': 'object', 'properties': {'d': {'type': 'date'}}}})",
     "is not one of object"),
    ("snowflake", "AI_COMPLETE('m', PROMPT('x {0}', r.body), {}, {'type': 'json', 'schema': {'type': 'string'}})",
     "the top level is an object of fields"),
])
def test_a_schema_quail_cannot_hold_a_generation_to_is_refused_naming_it(dialect, sql, message):
    with session() as opened, pytest.raises(quail.CompileError, match=message):
        opened.sql(f"SELECT {sql} FROM r", dialect=dialect)


@pytest.mark.plugins  # the worker finds the keyword backend through the example plugin's entry point
def test_generations_cross_a_process_boundary_as_data():
    """On a worker process the plan, its schema and the generated ids travel as codecs and Arrow; the rows equal
    the local ones (the worker finds the keyword rule through its entry point)."""
    sql = ("SELECT r.id, AI.GENERATE(('Who? ', r.body), output_schema => 'actor STRING, words INT64') AS g, "
           "AI.GENERATE(('Say ', r.body)).result AS t FROM r ORDER BY r.id")
    local = rows(sql, "bigquery")
    tokenizer = ByteTokenizer()
    config = quail.EngineConfig(model=BASE_MODEL, backend="example-keyword", cache="off", compute="process")
    with quail.Session(config, tokenizer=tokenizer) as opened:
        opened.register("r", pa.table({"id": list(range(len(BODIES))), "body": BODIES,
                                       "stars": [5, 3, 2, 4, 1, 3]}))
        remote = opened.sql(sql, dialect="bigquery").run().to_rows()
    assert remote == local and local[0]["t"] == expected()[0]


def test_ai_sentiment_answers_snowflakes_object_with_a_classification_per_category():
    """AI_SENTIMENT(text[, categories]) is an AI_CLASSIFY of the text into Snowflake's five sentiments per category
    (overall first); the keyword rule's label is the same whatever the category asks."""
    labels = "['positive', 'negative', 'neutral', 'mixed', 'unknown']"
    found = rows("SELECT r.id, AI_SENTIMENT(r.body, ['acting', 'music']) AS s, AI_CLASSIFY(PROMPT('What is the "
                 f"sentiment overall of {{0}}?', r.body), {labels}) AS c FROM r ORDER BY r.id")
    for row in found:
        expected_label = row["c"]
        assert row["s"] == {"categories": [{"name": name, "sentiment": expected_label}
                                           for name in ("overall", "acting", "music")]}
    assert found[1]["s"]["categories"][0]["sentiment"] is None, "NULL text, NULL sentiment"
    kept = rows("SELECT r.id FROM r WHERE AI_SENTIMENT(r.body):categories[0].sentiment = "
                f"(SELECT MIN(x.c) FROM (SELECT AI_CLASSIFY(PROMPT('What is the sentiment overall of {{0}}?', "
                f"q.body), {labels}) AS c FROM r q WHERE q.id = 0) x) ORDER BY r.id")
    assert {"id": 0} in kept


def test_snowflake_paths_read_an_ai_objects_typed_fields():
    found = rows("SELECT r.id, AI_EXTRACT(r.body, {'actor': 'Which actor?'}):response.actor AS a, "
                 "AI_SENTIMENT(r.body, ['x']):categories[1].name AS n FROM r ORDER BY r.id")
    assert found[0] == {"id": 0, "a": expected()[0], "n": "x"}


@pytest.mark.parametrize(("sql", "message"), [
    ("SELECT AI_SENTIMENT(r.body, 'cost') FROM r", "AI_SENTIMENT categories"),
    ("SELECT AI_SENTIMENT() FROM r", "AI_SENTIMENT with these arguments"),
])
def test_a_wrong_ai_sentiment_is_refused_by_name(sql, message):
    with session() as opened, pytest.raises(quail.CompileError, match=message):
        opened.sql(sql)


def test_bigquerys_generate_table_returns_the_input_columns_and_the_schemas_fields():
    sql = ("SELECT * FROM AI.GENERATE_TABLE(MODEL `project.dataset.model`, (SELECT CONCAT('Describe ', r.body) AS "
           "prompt, r.id FROM r), STRUCT('words INT64, great BOOL' AS output_schema, 200 AS max_output_tokens)) "
           "ORDER BY id")
    found = rows(sql, "bigquery")
    assert [list(row) for row in found][:1] == [["prompt", "id", "words", "great", "full_response", "status"]]
    assert found[0] == {"prompt": "Describe " + BODIES[0], "id": 0, "words": 8, "great": True,
                        "full_response": None, "status": ""}
    assert found[1]["prompt"] is None and found[1]["words"] is None


@pytest.mark.parametrize(("sql", "message"), [
    ("SELECT * FROM AI.GENERATE_TABLE(MODEL m, (SELECT r.body AS prompt FROM r), STRUCT(100 AS max_output_tokens))",
     "needs STRUCT"),
    ("SELECT * FROM AI.GENERATE_TABLE(MODEL m, (SELECT r.body AS prompt FROM r), STRUCT('a STRING' AS output_schema, "
     "1 AS colour))", "parameter"),
])
def test_a_generate_table_quail_cannot_run_is_refused_by_name(sql, message):
    with session() as opened, pytest.raises(quail.CompileError, match=message):
        opened.sql(sql, dialect="bigquery")


def test_a_column_that_is_the_whole_prompt_is_continued_with_no_instruction_of_quails():
    with session() as opened:
        node = next(n for n in opened.sql("SELECT AI_COMPLETE('m', r.body) AS g FROM r").plan().graph.nodes
                    if n.kind == "AiGenerate")
    assert ByteTokenizer().decode(node.tail) == "\nANSWER:"


def test_a_call_names_a_catalog_model_or_an_alias_and_an_unknown_name_is_refused_naming_the_known_ones():
    with session() as opened:
        other = opened.sql("SELECT AI_COMPLETE('qwen2.5-coder-0.5b-instruct', PROMPT('x {0}', r.body)) AS g FROM r")
        same = opened.sql(f"SELECT AI_COMPLETE('{BASE_MODEL}', PROMPT('x {{0}}', r.body)) AS g FROM r").explain()
        aliased = opened.sql("SELECT AI_COMPLETE('llama3.1-8b', PROMPT('x {0}', r.body)) AS g FROM r").explain()
        with pytest.raises(quail.CompileError, match=r"AI_COMPLETE names model 'gpt-9', which is neither one of "
                           r"Quail's generative models \(gemma-3-270m, .*\) nor an alias \(aliases: "
                           r"claude-4-sonnet = gemma-3-270m, .*--model-alias gpt-9=gemma-3-270m") as refused:
            opened.sql("SELECT r.id,\n AI_COMPLETE('gpt-9', PROMPT('x {0}', r.body)) AS g FROM r")
        with pytest.raises(quail.CompileError, match="names model 'all-minilm-l6-v2', which is not a generative "
                                                     "model"):
            opened.sql("SELECT AI_COMPLETE('all-minilm-l6-v2', PROMPT('x {0}', r.body)) AS g FROM r")
        assert "qwen2.5-coder-0.5b-instruct" in other.explain() and "AiGenerate" in same
    assert refused.value.line == 2 and 14 <= refused.value.column <= 20, "at the name 'gpt-9'"
    assert "stands for gemma-3-270m" in aliased


def test_snowflakes_type_object_response_format_is_read_as_a_schema():
    fmt = "TYPE OBJECT(words NUMBER, share FLOAT, great BOOLEAN, note VARCHAR, tags ARRAY(NUMBER))"
    found = rows(f"SELECT r.id, AI_COMPLETE('m', PROMPT('Count {{0}}', r.body), {{}}, {fmt}) AS x, "
                 "'TYPE OBJECT(' AS untouched FROM r ORDER BY r.id")
    assert found[0]["x"] == {"words": 7, "share": 0.7, "great": True, "note": "Great film.", "tags": [7]}
    assert found[0]["untouched"] == "TYPE OBJECT(", "text inside a string is not a type"


def test_a_bare_column_prompt_with_a_schema_names_the_fields_apart_from_the_document():
    with session() as opened:
        node = next(n for n in opened.sql("SELECT AI_COMPLETE('m', r.body, {}, {'type': 'json', 'schema': {'type': "
                                          "'object', 'properties': {'n': {'type': 'integer'}}}}) AS g FROM r")
                    .plan().graph.nodes if n.kind == "AiGenerate")
    assert ByteTokenizer().decode(node.tail) == "\n\nAnswer with a JSON object with these fields: n (integer).\nANSWER:"
