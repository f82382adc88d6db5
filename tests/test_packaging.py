"""The monorepo's packages: hatchling builds, entry points, and a torch-free core."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {
    "quail-core": "quail",
    "quail-native": "quail_native",
    "quail-vllm": "quail_vllm",
    "quail-sglang": "quail_sglang",
    "quail-ray": "quail_ray",
}


def project(package: str) -> dict:
    return tomllib.loads((ROOT / "packages" / package / "pyproject.toml").read_text())


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_each_package_builds_with_hatchling_and_has_a_readme(package):
    meta = project(package)
    assert meta["build-system"]["build-backend"] == "hatchling.build"
    assert meta["project"]["requires-python"] == ">=3.11"
    assert (ROOT / "packages" / package / "README.md").is_file()
    assert (ROOT / "packages" / package / "src" / PACKAGES[package] / "__init__.py").is_file()


@pytest.mark.parametrize("package", ["quail-native", "quail-vllm", "quail-sglang"])
def test_backend_packages_depend_on_core_and_register_an_entry_point(package):
    meta = project(package)["project"]
    assert any(dep.startswith("quail-core") for dep in meta["dependencies"])
    backend = package.removeprefix("quail-")
    assert meta["entry-points"]["quail"] == {backend: f"quail_{backend}.plugin"}


def test_the_ray_package_depends_on_core_and_ray_and_registers_its_compute_provider():
    meta = project("quail-ray")["project"]
    assert any(dep.startswith("quail-core") for dep in meta["dependencies"])
    assert any(dep.startswith("ray") for dep in meta["dependencies"])
    assert meta["entry-points"]["quail"] == {"ray": "quail_ray.plugin"}


def test_core_depends_on_no_engine():
    dependencies = " ".join(project("quail-core")["project"]["dependencies"])
    assert "torch" not in dependencies and "vllm" not in dependencies
    for name in ("pyarrow", "pluggy", "sqlglot"):
        assert name in dependencies


@pytest.mark.parametrize("package", ["quail-vllm", "quail-sglang"])
def test_request_backends_take_their_engine_only_through_extras(package):
    meta = project(package)["project"]
    hard = " ".join(meta["dependencies"])
    assert "vllm" not in hard.replace("quail-vllm", "") and "sglang" not in hard
    assert meta["optional-dependencies"]


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)


@pytest.mark.plugins
def test_importing_quail_and_loading_every_plugin_imports_no_torch():
    result = run_python(
        "import sys, quail\n"
        "registry = quail.ExtensionRegistry.with_built_ins()\n"
        "assert {'native', 'vllm', 'sglang'} <= set(registry.backends)\n"
        "assert 'ray' in registry.computes\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
        "assert 'ray' not in sys.modules, 'ray was imported'\n"
        "quail.release_engines()\n"
        "assert 'ray' not in sys.modules, 'releasing imported ray'\n"
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.slow
def test_core_installs_alone_without_torch(tmp_path):
    """`pip install ./packages/quail-core` alone, in isolation, then import it torch-free."""
    target = tmp_path / "site"
    install = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-input", "--target", str(target),
         str(ROOT / "packages" / "quail-core")],
        capture_output=True, text=True, check=False,
    )
    assert install.returncode == 0, install.stderr[-2000:]
    assert not list(target.glob("torch*")), "installing quail-core pulled in torch"
    check = subprocess.run(
        [sys.executable, "-I", "-c",
         f"import sys; sys.path.insert(0, {str(target)!r}); import quail; "
         "assert 'torch' not in sys.modules; print(quail.EngineConfig())"],
        capture_output=True, text=True, check=False,
    )
    assert check.returncode == 0, check.stderr
    assert "qwen2.5-coder-1.5b-instruct" in check.stdout
