"""The `quail` command line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from quail.cli import main


@pytest.mark.plugins
def test_backends_lists_the_first_party_backends_with_their_status(capsys):
    assert main(["backends"]) == 0
    out = capsys.readouterr().out
    lines = {line.split()[0]: line for line in out.splitlines()[1:] if line.startswith("  ")}
    assert {"native", "vllm", "sglang", "example"} <= set(lines)
    assert "quail-native 0.1.0" in lines["native"] and "supported" in lines["native"]
    assert "not supported" in lines["sglang"]


@pytest.mark.plugins
def test_backends_names_the_missing_engine_build_and_its_install_command(capsys):
    main(["backends", "--device", "h100-sxm"])
    out = capsys.readouterr().out
    assert "pip install 'quail-vllm[cuda]'" in out
    assert "pip install 'quail-sglang[engine]'" in out


def test_unknown_device_is_a_user_error_with_exit_code_2(capsys):
    assert main(["backends", "--device", "tpu"]) == 2
    assert "unknown device 'tpu'" in capsys.readouterr().err


def test_console_script_is_installed():
    result = subprocess.run([sys.executable, "-m", "quail.cli", "backends"], capture_output=True,
                            text=True, check=False)
    assert result.returncode == 0 and "native" in result.stdout


def test_the_installed_console_script_exits_with_the_code_main_returns():
    """`quail` is `entry_point`: main's exit code (0, or 2 for a user error with its message), then exit."""
    script = Path(sys.executable).with_name("quail")
    assert script.is_file(), "the quail console script is installed beside the interpreter"
    ok = subprocess.run([str(script), "backends"], capture_output=True, text=True, check=False)
    assert ok.returncode == 0 and "native" in ok.stdout
    bad = subprocess.run([str(script), "backends", "--device", "tpu"], capture_output=True, text=True, check=False)
    assert bad.returncode == 2 and "unknown device 'tpu'" in bad.stderr


def test_the_console_script_exits_quietly_after_a_leak_checking_extension_was_loaded():
    """triton (which vLLM imports) reports objects still alive at exit as leaks: the fast exit must not
    leave its objects uncollected."""
    pytest.importorskip("triton")
    run = subprocess.run([sys.executable, "-c", "import sys, triton; from quail.cli import entry_point; "
                          "sys.argv = ['quail', 'backends']; sys.exit(entry_point())"],
                         capture_output=True, text=True, check=False)
    assert run.returncode == 0 and "native" in run.stdout
    assert "leaked" not in run.stderr, run.stderr[:400]
