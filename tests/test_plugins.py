"""Plugins are discovered through entry points, and a broken one never breaks the others."""

from __future__ import annotations

import warnings

import pytest

import quail
from quail import EngineConfig, ExtensionRegistry, RefusalError, Session
from quail.cli import main
from quail.plugins.loading import PluginLoadWarning

GOOD_PLUGIN = """
import quail
from quail_example.backend import ExampleBackend

class Renamed(ExampleBackend):
    name = "{name}"

@quail.hookimpl
def quail_register(registry):
    registry.register_backend(Renamed())
"""


def test_third_party_backend_is_discovered_with_no_registration_code():
    registry = ExtensionRegistry.with_built_ins()
    assert "example" in registry.backends
    origin = registry.origin("backend", "example")
    assert (origin.distribution, origin.version) == ("quail-example-backend", "0.0.1")


def test_third_party_backend_is_selectable_by_name():
    with Session(EngineConfig(backend="example")) as session:
        assert session.backend.name == "example"


@pytest.mark.plugins
def test_plugin_that_raises_on_import_is_reported_and_others_still_load(install_plugin):
    install_plugin("quail-broken", "broken", "raise RuntimeError('missing shared library')\n")
    with pytest.warns(PluginLoadWarning, match="missing shared library"):
        registry = ExtensionRegistry.with_built_ins()
    assert {"native", "example"} <= set(registry.backends)
    [failure] = registry.plugin_failures
    assert failure.stage == "import" and failure.origin.distribution == "quail-broken"


def test_asking_for_a_broken_plugins_backend_names_its_failure(install_plugin):
    install_plugin("quail-broken", "broken", "raise RuntimeError('missing shared library')\n")
    with pytest.warns(PluginLoadWarning):
        registry = ExtensionRegistry.with_built_ins()
    with pytest.raises(RefusalError, match="missing shared library") as caught:
        Session(EngineConfig(backend="broken"), registry=registry)
    assert "quail-broken" in str(caught.value)


def test_plugin_registering_something_that_is_not_a_backend_is_isolated(install_plugin):
    install_plugin("quail-junk", "junk", """
        import quail

        @quail.hookimpl
        def quail_register(registry):
            registry.register_backend("not a backend")
    """)
    with pytest.warns(PluginLoadWarning, match="not a ModelBackend"):
        registry = ExtensionRegistry.with_built_ins()
    assert "example" in registry.backends
    assert registry.plugin_failures[0].stage == "register"


@pytest.mark.plugins
def test_plugin_duplicating_a_backend_name_keeps_the_first_and_reports_both(install_plugin):
    install_plugin("quail-impostor", "impostor", GOOD_PLUGIN.format(name="native"))
    with pytest.warns(PluginLoadWarning, match="already registered") as caught:
        registry = ExtensionRegistry.with_built_ins()
    message = str(caught[0].message)
    assert "quail-native" in message and "quail-impostor" in message
    assert registry.origin("backend", "native").distribution == "quail-native"


def test_a_failing_plugin_keeps_none_of_its_registrations(install_plugin):
    install_plugin("quail-half", "half", """
        import quail
        from quail_example.backend import ExampleBackend

        class First(ExampleBackend):
            name = "half-first"

        @quail.hookimpl
        def quail_register(registry):
            registry.register_backend(First())
            raise RuntimeError("bug after the first registration")
    """)
    with pytest.warns(PluginLoadWarning, match="bug after the first registration"):
        registry = ExtensionRegistry.with_built_ins()
    assert "half-first" not in registry.backends
    with pytest.raises(RefusalError, match="bug after the first registration"):
        registry.backend("half-first")


def test_a_plugin_module_with_no_hook_is_reported(install_plugin):
    install_plugin("quail-empty", "empty", "VALUE = 1\n")
    with pytest.warns(PluginLoadWarning, match="implements no quail hook"):
        ExtensionRegistry.with_built_ins()


def test_a_new_well_formed_plugin_is_picked_up_without_code_changes(install_plugin):
    install_plugin("quail-another", "another", GOOD_PLUGIN.format(name="another"))
    with warnings.catch_warnings():
        warnings.simplefilter("error", PluginLoadWarning)
        registry = ExtensionRegistry.with_built_ins()
    assert registry.origin("backend", "another").distribution == "quail-another"


def test_hookimpl_is_exported_for_plugin_authors():
    assert quail.hookimpl is quail.plugins.hookspecs.hookimpl


@pytest.mark.plugins
def test_an_entry_point_named_like_a_first_party_backend_does_not_replace_it(install_plugin, capsys):
    install_plugin("quail-impostor", "native", GOOD_PLUGIN.format(name="native"))
    with pytest.warns(PluginLoadWarning, match="already registered") as caught:
        registry = ExtensionRegistry.with_built_ins()
    message = str(caught[0].message)
    assert "quail-native" in message and "quail-impostor" in message
    assert registry.origin("backend", "native").distribution == "quail-native"
    assert type(registry.backends["native"]).__module__.startswith("quail_native")
    with pytest.warns(PluginLoadWarning):
        assert main(["backends"]) == 0
    out = capsys.readouterr().out
    [native] = [line for line in out.splitlines() if line.split()[:1] == ["native"]]
    assert "quail-native" in native and "quail-impostor" not in native
    assert any(line.startswith("  !") and "quail-impostor" in line for line in out.splitlines())


def test_two_entry_points_with_one_name_both_load(install_plugin):
    install_plugin("quail-twin-a", "twin", GOOD_PLUGIN.format(name="twin-a"))
    install_plugin("quail-twin-b", "twin", GOOD_PLUGIN.format(name="twin-b"))
    with warnings.catch_warnings():
        warnings.simplefilter("error", PluginLoadWarning)
        registry = ExtensionRegistry.with_built_ins()
    assert registry.origin("backend", "twin-a").distribution == "quail-twin-a"
    assert registry.origin("backend", "twin-b").distribution == "quail-twin-b"


def test_one_backend_name_from_two_distributions_is_a_warning_naming_both(install_plugin):
    install_plugin("quail-twin-b", "twin", GOOD_PLUGIN.format(name="twin"))
    install_plugin("quail-twin-a", "twin", GOOD_PLUGIN.format(name="twin"))
    with pytest.warns(PluginLoadWarning, match="already registered") as caught:
        registry = ExtensionRegistry.with_built_ins()
    [message] = [str(w.message) for w in caught if "twin" in str(w.message)]
    assert "quail-twin-a" in message and "quail-twin-b" in message
    assert registry.origin("backend", "twin").distribution == "quail-twin-a"  # the same winner on every machine


@pytest.mark.plugins
def test_backends_listing_survives_a_plugin_whose_supports_raises(install_plugin, capsys):
    install_plugin("quail-flaky", "flaky", """
        import quail
        from quail_example.backend import ExampleBackend

        class Flaky(ExampleBackend):
            name = "flaky"

            def supports(self, model, device, gpu_count):
                raise RuntimeError("driver probe crashed")

        @quail.hookimpl
        def quail_register(registry):
            registry.register_backend(Flaky())
    """)
    assert main(["backends"]) == 0
    captured = capsys.readouterr()
    lines = {line.split()[0]: line for line in captured.out.splitlines()[1:] if line.startswith("  ")}
    assert {"native", "example", "flaky"} <= set(lines)
    assert "failed: supports() raised RuntimeError: driver probe crashed" in lines["flaky"]
    assert "supported" in lines["native"] and "Traceback" not in captured.err


def test_quails_own_extensions_arrive_through_the_plugin_hook_like_a_third_partys(monkeypatch):
    from quail.plugins import builtin

    seen: list[object] = []
    original = builtin.quail_register

    def spying(registry):
        seen.append(registry)
        original(registry)

    monkeypatch.setattr(builtin, "quail_register", quail.hookimpl(spying))
    registry = quail.ExtensionRegistry.with_built_ins()
    assert len(seen) == 1 and seen[0] is not registry, "staged like any plugin, then committed as one batch"
    for kind, name in (("model", "gemma-3-270m"), ("device", "cpu"), ("compute", "local"), ("compute", "process")):
        assert registry.origin(kind, name).distribution == "quail-core"
    assert [rule.name for rule in registry.logical_rules][:2] == [r.name for r in builtin.BUILT_IN_RULES][:2]
