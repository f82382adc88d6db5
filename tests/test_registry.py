"""ExtensionRegistry: validation, duplicates naming both registrants, read-only views."""

from __future__ import annotations

import dataclasses

import pytest

from quail import ExtensionRegistry, ModelSpec
from quail.catalog.models import GEMMA_3_270M
from quail.plugins.kinds import Origin
from quail_example.backend import ExampleBackend


def test_registered_backend_is_found_by_name():
    registry = ExtensionRegistry()
    backend = ExampleBackend()
    registry.register_backend(backend)
    assert registry.backend("example") is backend
    assert registry.origin("backend", "example").source == "user code"


def test_duplicate_name_raises_value_error_naming_both_registrants():
    registry = ExtensionRegistry()
    registry.register_backend(ExampleBackend(), origin=Origin("plugin 'first'", "dist-one", "1.0"))
    with pytest.raises(ValueError) as caught:
        registry.register_backend(ExampleBackend(), origin=Origin("plugin 'second'", "dist-two", "2.0"))
    assert "dist-one 1.0" in str(caught.value) and "dist-two 2.0" in str(caught.value)


def test_duplicate_model_names_are_refused_too():
    registry = ExtensionRegistry()
    registry.register_model(GEMMA_3_270M)
    with pytest.raises(ValueError, match="already registered"):
        registry.register_model(dataclasses.replace(GEMMA_3_270M, layers=2))


def test_object_that_is_not_a_backend_is_refused():
    registry = ExtensionRegistry()
    with pytest.raises(ValueError, match="not a ModelBackend"):
        registry.register_backend(object())  # type: ignore[arg-type]


def test_backend_with_an_invalid_name_is_refused():
    backend = ExampleBackend()
    backend.name = "Has Spaces"
    with pytest.raises(ValueError, match="names are lower-case"):
        ExtensionRegistry().register_backend(backend)


def test_a_batch_lands_whole_or_not_at_all():
    registry = ExtensionRegistry()
    good = dataclasses.replace(GEMMA_3_270M, name="fine-model")
    with pytest.raises(ValueError):
        registry.register_all([("model", good), ("backend", object())], Origin("batch"))  # type: ignore[list-item]
    assert "fine-model" not in registry.models


def test_views_are_read_only():
    registry = ExtensionRegistry.with_built_ins()
    with pytest.raises(TypeError):
        registry.models["x"] = GEMMA_3_270M  # type: ignore[index]
    with pytest.raises(TypeError):
        registry.backends["x"] = ExampleBackend()  # type: ignore[index]


@pytest.mark.plugins
def test_built_ins_hold_the_catalog_and_the_first_party_backends():
    registry = ExtensionRegistry.with_built_ins()
    assert {"gemma-3-270m", "qwen3-8b"} <= set(registry.models)
    assert {"cpu", "h200"} <= set(registry.devices)
    assert {"native", "vllm", "sglang"} <= set(registry.backends)
    assert registry.origin("backend", "native").distribution == "quail-native"


def test_users_can_register_their_own_model():
    registry = ExtensionRegistry.with_built_ins()
    mine = ModelSpec(name="my-qwen", architecture="qwen3", layers=2, hidden=64, heads=4, kv_heads=2,
                     head_dim=16, ffn=128, vocab=1024, context_length=512)
    registry.register_model(mine)
    assert registry.model("my-qwen") is mine
