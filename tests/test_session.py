"""Session validates its configuration before anything else can happen."""

from __future__ import annotations

import pyarrow as pa
import pytest

from quail import DocumentProvider, EngineConfig, ExtensionRegistry, QuailError, RefusalError, Session
from quail.catalog.devices import BUILT_IN_DEVICES
from quail.catalog.models import BUILT_IN_MODELS
from quail.extend import SupportResult
from quail.plugins import builtin
from quail_example.backend import ExampleBackend


def catalog_only_registry() -> ExtensionRegistry:
    """Quail's built-ins (catalog, rules, compute providers) and no plugin: no backend at all."""
    registry = ExtensionRegistry()
    builtin.quail_register(registry)
    return registry


def test_default_config_is_the_embedded_model_on_cpu_with_native():
    config = EngineConfig()
    assert (config.model, config.device, config.backend, config.gpus) == ("qwen2.5-coder-1.5b-instruct", "cpu",
                                                                          "native", 1)


def test_config_is_frozen_and_rejects_zero_gpus():
    with pytest.raises(AttributeError):
        EngineConfig().model = "x"  # type: ignore[misc]
    with pytest.raises(ValueError, match="gpus"):
        EngineConfig(gpus=0)


@pytest.mark.parametrize(("options", "message"), [
    ({"workers": 0}, "EngineConfig.workers must be None or at least 1, got 0"),
    ({"worker_cpus": 0}, "EngineConfig.worker_cpus must be more than 0"),
    ({"worker_gpus": -1.0}, "EngineConfig.worker_gpus must be None or at least 0"),
    ({"address": " "}, "EngineConfig.address must be None, 'auto' or a cluster address"),
])
def test_placement_options_are_checked(options, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig(**options)


def test_placement_is_not_an_engine_setting():
    placed = EngineConfig(compute="ray", address="auto", workers=4, worker_cpus=2.0, worker_gpus=0.5)
    assert placed.engine_settings() == EngineConfig().engine_settings()


@pytest.mark.plugins
def test_default_session_opens_on_this_machine():
    with Session() as session:
        assert session.backend.name == "native"
        assert session.model.name == "qwen2.5-coder-1.5b-instruct"
    assert session.closed


def test_unknown_model_lists_the_known_ones():
    with pytest.raises(RefusalError, match=r"unknown model 'gpt-9'.*qwen3-8b"):
        Session(EngineConfig(model="gpt-9"))


def test_unknown_device_lists_the_known_ones():
    with pytest.raises(RefusalError, match=r"unknown device 'tpu'.*h100-sxm"):
        Session(EngineConfig(device="tpu"))


@pytest.mark.plugins
def test_unknown_backend_lists_the_installed_ones():
    with pytest.raises(RefusalError, match=r"unknown backend 'nope'.*installed backends: .*native"):
        Session(EngineConfig(backend="nope"))


def test_first_party_backend_that_is_not_installed_says_how_to_install_it():
    with pytest.raises(RefusalError, match="pip install quail-vllm") as caught:
        Session(EngineConfig(backend="vllm"), registry=catalog_only_registry())
    assert caught.value.refusal.constraint == "unknown backend 'vllm'"


def test_support_rejection_is_raised_with_its_reason():
    class PickyBackend(ExampleBackend):
        name = "picky"

        def supports(self, model, device, gpu_count):
            return SupportResult.reject("only runs on Tuesdays")

    registry = catalog_only_registry()
    registry.register_backend(PickyBackend())
    with pytest.raises(RefusalError, match="only runs on Tuesdays"):
        Session(EngineConfig(backend="picky"), registry=registry)


@pytest.mark.plugins
def test_gpu_device_on_a_machine_without_one_is_refused_by_native():
    if ExtensionRegistry.with_built_ins().backend("native").supports(
            BUILT_IN_MODELS[0], BUILT_IN_DEVICES[1], 1).accepted:
        pytest.skip("this machine has a CUDA device")
    with pytest.raises(RefusalError, match="CUDA device"):
        Session(EngineConfig(device="h100-sxm"))


def test_support_result_needs_a_reason_to_reject():
    with pytest.raises(ValueError):
        SupportResult.reject("")


def test_a_closed_session_says_so_instead_of_failing_inside():
    session = Session(EngineConfig(backend="example-keyword"))
    session.register("reviews", DocumentProvider.from_table(pa.table({"id": [1], "body": ["fine"]}), "id"))
    query = session.sql("SELECT r.id FROM reviews r WHERE AI_FILTER(PROMPT('Is {0} fine?', r.body))")
    session.close()
    for attempt in (query.run, lambda: session.sql("SELECT 1"), lambda: session.docs("reviews"),
                    lambda: session.register("more", DocumentProvider.from_table(pa.table({"id": [1]}), "id"))):
        with pytest.raises(QuailError, match="this session is closed"):
            attempt()
