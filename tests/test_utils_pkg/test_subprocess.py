"""execute_subprocess_async streams and returns the output, and fails with it; run_command too."""

from __future__ import annotations

import subprocess
import sys

import pytest

from accelerando.test_utils import testing

_TWO_STREAMS = "import sys; print('out-line-1'); print('err-line', file=sys.stderr); print('out-line-2')"


def test_success_returns_and_echoes_the_lines(capsys):
    result = testing.execute_subprocess_async([sys.executable, "-c", _TWO_STREAMS])
    assert result.returncode == 0
    assert result.stdout == ["out-line-1", "out-line-2"]
    assert result.stderr == ["err-line"]
    captured = capsys.readouterr()
    assert "Running: " in captured.out and "out-line-2" in captured.out
    assert "err-line" in captured.err


def test_quiet_and_no_echo_print_nothing(capsys):
    result = testing.execute_subprocess_async([sys.executable, "-c", _TWO_STREAMS], quiet=True, echo=False)
    assert result.stdout == ["out-line-1", "out-line-2"]
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""


def test_failure_raises_with_the_output_and_status(tmp_path):
    script = tmp_path / "fails.py"
    script.write_text("import sys\nprint('progress so far')\nsys.exit('the real reason it broke')\n")
    with pytest.raises(RuntimeError) as info:
        testing.execute_subprocess_async([sys.executable, script], quiet=True)
    message = str(info.value)
    assert "returncode 1" in message
    assert "the real reason it broke" in message and "progress so far" in message
    assert str(script) in message


def test_env_and_stdin_are_passed(tmp_path):
    source = tmp_path / "in.txt"
    source.write_text("from stdin\n")
    code = "import os, sys; print(os.environ['H3_VALUE']); print(sys.stdin.read().strip())"
    with source.open("rb") as handle:
        result = testing.execute_subprocess_async(
            [sys.executable, "-c", code],
            env={"H3_VALUE": "42", "PATH": "/usr/bin:/bin"},
            stdin=handle,
            quiet=True,
        )
    assert result.stdout == ["42", "from stdin"]


def test_timeout_kills_and_raises():
    with pytest.raises(RuntimeError, match="did not finish within"):
        testing.execute_subprocess_async(
            [sys.executable, "-c", "import time; print('started', flush=True); time.sleep(60)"],
            timeout=3,
            quiet=True,
        )


def test_accelerando_program_runs_without_the_console_script(monkeypatch):
    from accelerando.test_utils import _subprocess

    monkeypatch.setattr(_subprocess.shutil, "which", lambda name: None)
    assert _subprocess._resolve_program(["accelerando", "env"]) == [
        sys.executable,
        "-m",
        "accelerando",
        "env",
    ]


def test_run_command():
    out = testing.run_command([sys.executable, "-c", _TWO_STREAMS], return_stdout=True)
    assert "out-line-1" in out and "err-line" in out
    assert testing.run_command([sys.executable, "-c", "pass"]) is None
    with pytest.raises(testing.SubprocessCallException, match="boom"):
        testing.run_command([sys.executable, "-c", "raise SystemExit('boom')"])


def test_lazy_package_import_loads_no_test_framework_or_transformers():
    code = (
        "import sys, accelerando.test_utils as t; t.require_cpu; t.RegressionModel;"
        "bad=[m for m in sys.modules if m.split('.')[0] in ('pytest','transformers','datasets','accelerate')];"
        "print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
