"""A model per call: a statement's AI calls may name the model that answers them (BigQuery's `endpoint =>`,
Snowflake's `AI_COMPLETE('model', …)`, a `'model'` option), directly or by an alias the configuration declares; one
statement may use two models. On the keyword test backend (its answers do not depend on the model, so the rows are
the oracle's whatever model answers); the real two-model run is in packages/quail-native/tests/test_real_models.py."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from support.relational_oracle import TABLES, keyword_session, oracle_rows, same_rows

import quail
import quail.compute.wire
from quail.backends.base import SupportResult
from quail.errors import ConfigError, RefusalError
from quail.logical.nodes import render
from quail.physical.codecs import from_json, to_json
from quail.testing import ByteTokenizer
from quail.testing.backend import KeywordBackend

SESSION_MODEL = quail.EngineConfig().model
OTHER = "qwen2.5-coder-0.5b-instruct"
ALIASES = {"gemini-2.5-flash": OTHER, "mine": SESSION_MODEL}


@pytest.fixture(scope="module")
def session() -> Iterator[quail.Session]:
    with keyword_session(aliases=ALIASES) as opened:
        yield opened


def test_two_models_in_one_statement_each_answer_their_own_calls(session):
    sql = ("SELECT r.id, AI.CLASSIFY(r.body, ['good', 'bad'], endpoint => 'gemini-2.5-flash') AS c FROM reviews r "
           "WHERE AI.IF(('Is the acting praised? ', r.body)) AND r.stars > 1")
    result = session.sql(sql, dialect="bigquery").run()
    plain = sql.replace(", endpoint => 'gemini-2.5-flash'", "")
    problem = same_rows(result.collect(), oracle_rows(plain, "bigquery"), ordered=False)
    assert problem is None, problem
    assert result.report["model"] == f"{OTHER}, {SESSION_MODEL}"
    text = result.explain()
    assert f"backend keyword, model {OTHER};" in text and f"backend keyword, model {SESSION_MODEL};" in text
    assert f"model 'gemini-2.5-flash' stands for {OTHER} (EngineConfig.model_aliases)" in text


def test_an_ai_join_and_its_blocks_calls_naming_one_model_are_planned_together_on_it(session):
    sql = ("SELECT r.id, a.aspect FROM reviews r JOIN aspects a ON AI.IF(('Does ', r.body, ' discuss ', a.aspect, "
           "'?'), endpoint => 'gemini-2.5-flash') WHERE AI.IF(('Is it long? ', r.body), endpoint => "
           f"'{OTHER}')")
    query = session.sql(sql, dialect="bigquery")
    assert isinstance(query, quail.Query) and query.session.model.name == OTHER, "one block, planned whole"
    assert f"model {OTHER};" in query.explain()
    plain = sql.replace(", endpoint => 'gemini-2.5-flash'", "").replace(f", endpoint => '{OTHER}'", "")
    problem = same_rows(query.run().collect(), oracle_rows(plain, "bigquery"), ordered=False)
    assert problem is None, problem


@pytest.mark.parametrize("in_cte", [False, True])
def test_an_ai_join_whose_block_mixes_models_is_answered_by_the_general_rule(session, in_cte):
    """The join's question is asked of the pairs of its two tables on its model, the filter on the session's."""
    block = ("SELECT r.id, a.aspect FROM reviews r JOIN aspects a ON AI.IF(('Does ', r.body, ' discuss ', a.aspect, "
             "'?'), endpoint => 'gemini-2.5-flash') WHERE AI.IF(('Is it about \"acting\"? ', r.body))")
    sql = f"WITH j AS ({block}) SELECT * FROM j" if in_cte else block
    result = session.sql(sql, dialect="bigquery").run()
    plain = sql.replace(", endpoint => 'gemini-2.5-flash'", "")
    problem = same_rows(result.collect(), oracle_rows(plain, "bigquery"), ordered=False)
    assert problem is None, problem
    assert result.report["model"] == f"{OTHER}, {SESSION_MODEL}" or result.report["model"] == \
        f"{SESSION_MODEL}, {OTHER}"


@pytest.mark.parametrize(("dialect", "named"), [
    ("bigquery", "SELECT r.id FROM reviews r WHERE AI.IF(('Is it good? ', r.body), endpoint => 'mine')"),
    ("bigquery", f"SELECT r.id FROM reviews r WHERE AI.IF(('Is it good? ', r.body), model => '{SESSION_MODEL}')"),
    ("snowflake", "SELECT r.id FROM reviews r WHERE AI_FILTER(PROMPT('Is it good? {0}', r.body), {'model': 'mine'})"),
])
def test_naming_the_sessions_own_model_plans_as_naming_none(session, dialect, named):
    plain = "SELECT r.id FROM reviews r WHERE AI_FILTER(PROMPT('Is it good? {0}', r.body))"
    query = session.sql(named, dialect=dialect)
    assert isinstance(query, quail.Query) and query.session is session
    assert render(query.logical_plan) == render(session.sql(plain).logical_plan)


def test_an_alias_of_any_catalog_model_plans_on_that_model_without_running_it():
    """Planning (explain) on a model the alias names needs no model work: a 32B catalog model the keyword backend
    accepts is planned on, by name, and nothing is booted."""
    with keyword_session(aliases={"big": "qwen3-32b"}) as opened:
        query = opened.sql("SELECT AI_COMPLETE('big', PROMPT('Summarize {0}', r.body)) AS s FROM reviews r")
        assert "qwen3-32b" in query.explain()


@pytest.mark.parametrize(("aliases", "words"), [
    ({"x": "no-such-model"}, "'x' stands for 'no-such-model', which is not one of Quail's models"),
    ({"gemma-3-270m": OTHER}, "'gemma-3-270m' is a catalog model's own name"),
])
def test_an_alias_must_stand_for_a_catalog_model_and_hide_none(aliases, words):
    with pytest.raises(ConfigError, match=words):
        keyword_session(aliases=aliases)


@pytest.mark.parametrize(("value", "error"), [
    ({"": "gemma-3-270m"}, ConfigError), ({"x": 3}, ConfigError), ("x=y", TypeError), ([("a", "b", "c")], TypeError),
])
def test_model_aliases_are_checked_by_engine_config(value, error):
    with pytest.raises(error, match="model_aliases"):
        quail.EngineConfig(model_aliases=value)


def test_aliases_are_kept_as_sorted_pairs_that_hash_and_cross_the_wire():
    config = quail.EngineConfig(model_aliases={"b": OTHER, "a": SESSION_MODEL})
    assert config.model_aliases == (("a", SESSION_MODEL), ("b", OTHER))
    assert config == quail.EngineConfig(model_aliases=[("b", OTHER), ("a", SESSION_MODEL)]) and hash(config)
    assert config.engine_settings().model_aliases == (), "aliases are read when planning, never by an engine"
    assert config.catalog_name("b") == OTHER and config.catalog_name(OTHER) == OTHER


def test_a_config_with_aliases_crosses_the_process_boundary_as_data():
    config = quail.EngineConfig(model_aliases={"gemini-2.5-flash": OTHER})
    assert from_json(json.loads(json.dumps(to_json(config)))) == config


class ChoosyBackend(KeywordBackend):
    """The keyword backend, but it cannot run one model (as a backend without that model's architecture)."""

    name = "choosy"

    def supports(self, model, device, gpu_count):
        if model.name == OTHER:
            return SupportResult.reject(f"no kernels for {model.architecture} here")
        return super().supports(model, device, gpu_count)


def test_a_model_the_backend_cannot_run_is_refused_before_any_model_work_and_the_session_stays_usable():
    tokenizer = ByteTokenizer()
    registry = quail.ExtensionRegistry.with_built_ins()
    registry.register_backend(ChoosyBackend(tokenizer))
    config = quail.EngineConfig(backend="choosy", cache="off")
    with quail.Session(config, registry=registry, tokenizer=tokenizer) as opened:
        opened.register("reviews", TABLES["reviews"])
        named = f"SELECT r.id, AI_COMPLETE('{OTHER}', PROMPT('Summarize {{0}}', r.body)) AS s FROM reviews r"
        with pytest.raises(RefusalError) as refused:
            opened.sql(named)  # compiling it: nothing is booted or asked
        message = str(refused.value)
        assert f"backend 'choosy' cannot run model '{OTHER}'" in message and "no kernels for" in message
        plain = "SELECT r.id FROM reviews r WHERE AI_FILTER(PROMPT('Is the acting praised? {0}', r.body))"
        problem = same_rows(opened.sql(plain).run().collect(), oracle_rows(plain, "snowflake"), ordered=False)
        assert problem is None, problem
