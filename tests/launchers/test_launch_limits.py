"""Bounds of a launch (issue 27, item 7's messages): a huge value is not echoed whole by ``--dry_run``, a
launch that the operating system could not exec says which value and the fix (exit 2), and an absurd
process count on one machine is refused before anything starts.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from accelerando.launchers.limits import (
    ARG_STRING_MAX,
    MAX_PROCESSES_PER_MACHINE,
    check_exec_size,
    check_process_count,
    clip,
)

HUGE = 4 * 2**20  # bytes of the huge value: far over Linux's 128 KiB per argument or variable


def _launch(tmp_path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE", "ACCELERANDO"))}
    env.update(XDG_CACHE_HOME=str(tmp_path / "cache"), HF_HOME=str(tmp_path / "hf"))
    argv = [sys.executable, "-m", "accelerando.commands.launch", *args]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)


@pytest.fixture
def huge_config(tmp_path):
    (tmp_path / "train.py").write_text("open('ran', 'w').close()\n")
    config = tmp_path / "config.yaml"
    config.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: 'NO'\n"
                      f"main_training_function: {'x' * HUGE}\n")  # fmt: skip
    return config


def test_clip_keeps_short_text_and_cuts_long_text_with_its_size() -> None:
    assert clip("short") == "short"
    assert clip("é" * 10, limit=2) == "éé... (20 bytes)"


def test_dry_run_bounds_what_it_echoes_of_a_huge_config_value(tmp_path, huge_config) -> None:
    start = time.monotonic()
    result = _launch(tmp_path, "--config_file", str(huge_config), "--dry_run", "train.py")
    took = time.monotonic() - start
    assert result.returncode == 0, result.stderr[-2000:]
    assert len(result.stdout) < 50_000, len(result.stdout)  # was twice the value
    assert f"... ({HUGE} bytes)" in result.stdout
    assert took < 60, took


def test_a_real_launch_with_a_huge_value_says_which_and_the_fix_instead_of_argument_list_too_long(
    tmp_path, huge_config
) -> None:
    result = _launch(tmp_path, "--config_file", str(huge_config), "train.py")
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr[-2000:]
    assert "ACCELERANDO_MAIN_TRAINING_FUNCTION" in lines[0] and "main_training_function" in lines[0]
    assert "Fix:" in lines[0] and "Traceback" not in result.stderr
    assert len(lines[0]) < 1000
    assert not (tmp_path / "ran").exists()


def test_check_exec_size_names_the_largest_value_and_the_total() -> None:
    check_exec_size(["python", "x.py"], {"A": "1"}, environ={})
    with pytest.raises(ValueError, match=r"command-line argument 2 is \d+ bytes.*Fix:"):
        check_exec_size(["python", "x.py", "y" * (ARG_STRING_MAX + 1)], {}, environ={})
    with pytest.raises(ValueError, match=r"BIG \(setting x, from cli:--x\).*Fix:"):
        check_exec_size(
            ["python"], {"BIG": "z" * ARG_STRING_MAX}, environ={}, names={"BIG": "setting x, from cli:--x"}
        )
    many = {f"V{i}": "v" * 100_000 for i in range(os.sysconf("SC_ARG_MAX") // 100_000 + 1)}
    with pytest.raises(ValueError, match="total .* bytes, over the"):
        check_exec_size(["python"], many, environ={})


def test_an_absurd_process_count_is_refused_by_dry_run_with_the_number_and_the_fix(tmp_path) -> None:
    (tmp_path / "train.py").write_text("pass\n")
    result = _launch(tmp_path, "--num_processes", "100000", "--cpu", "--dry_run", "train.py")
    assert result.returncode == 2, result.stdout[-2000:]
    line = result.stderr.strip()
    assert "\n" not in line and "100000" in line and "Fix:" in line and "--num_processes" in line, line


def test_check_process_count_bounds_by_our_limit_and_the_machines() -> None:
    check_process_count(8, "num_processes=8", limit=None)
    with pytest.raises(ValueError, match=f"at most {MAX_PROCESSES_PER_MACHINE} processes per machine"):
        check_process_count(MAX_PROCESSES_PER_MACHINE + 1, "num_processes=x", limit=10**6)
    with pytest.raises(ValueError, match="lets this user start at most 64 processes"):
        check_process_count(100, "num_processes=100", limit=64)
