"""Shared fixtures (installing throwaway plugin distributions onto sys.path), and what quail-core alone skips."""

from __future__ import annotations

import importlib.util
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

InstallPlugin = Callable[[str, str, str], None]

NEEDS = {"test_ray.py": "quail_ray", "test_sglang_backend.py": "quail_sglang",
         "test_example_backend.py": "quail_native", "test_serve_models.py": "quail_native",
         "test_serve_browser.py": "quail_native", "test_serve_ray.py": "quail_ray"}
"""Modules that import a first-party plugin: with quail-core alone (its own tests: `-m "not plugins"`) they are
not collected; everything else in tests/ runs there."""
collect_ignore = [module for module, needed in NEEDS.items() if importlib.util.find_spec(needed) is None]


@pytest.fixture
def install_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> InstallPlugin:
    """Put a real distribution (dist-info with an entry point in group "quail") on sys.path.

    `install_plugin(distribution, entry_name, module_source)` makes the module importable and
    discoverable through importlib.metadata exactly as `pip install` would; removed after the test.
    """
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))

    def install(distribution: str, entry_name: str, module_source: str) -> None:
        module = f"{distribution.replace('-', '_')}_plugin"
        (site / f"{module}.py").write_text(textwrap.dedent(module_source))
        info = site / f"{distribution.replace('-', '_')}-0.1.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: 0.1\n")
        (info / "entry_points.txt").write_text(f"[quail]\n{entry_name} = {module}\n")
        monkeypatch.delitem(sys.modules, module, raising=False)

    return install
