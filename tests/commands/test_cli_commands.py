"""`accelerando env`, `accelerando test`, `accelerando tpu-config` and the top-level parser."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from accelerando.commands.cli import main


@pytest.fixture
def env(tmp_path, monkeypatch):
    for key in list(os.environ):
        if key.startswith(("ACCELERATE", "ACCELERANDO", "FSDP_")):
            monkeypatch.delenv(key)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    return {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}


def test_env_reports_versions_hardware_and_sources(env, tmp_path, capsys, monkeypatch):
    config = tmp_path / "c.yaml"
    config.write_text("mixed_precision: fp16\nnum_processes: 2\nuse_cpu: true\n")
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    assert main(["env", "--config_file", str(config)]) == 0
    out = capsys.readouterr().out
    assert "python:" in out and "torch:" in out and "accelerando:" in out
    assert "CPUs:" in out and "RAM:" in out and "GPUs:" in out
    assert "mixed_precision: 'bf16' [env:ACCELERATE_MIXED_PRECISION]" in out
    assert f"num_processes: 2 [config:{config}]" in out
    config.write_text("mixed_precison: fp16\n")
    assert main(["env", "--config_file", str(config)]) == 2
    assert "Did you mean 'mixed_precision'" in capsys.readouterr().err


def test_tpu_config_answers_clearly_and_help_lists_commands(env, capsys):
    assert main(["tpu-config", "--tpu_name", "x"]) == 2  # nothing to run on the pod
    assert "--command" in capsys.readouterr().err
    assert main([]) == 0
    out = capsys.readouterr().out
    for command in ("launch", "config", "env", "test", "tpu-config", "to-fsdp2"):
        assert command in out


@pytest.mark.slow
def test_accelerando_test_passes_with_two_processes_and_accumulation(env, tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(
        "distributed_type: MULTI_CPU\nuse_cpu: true\nnum_processes: 2\ngradient_accumulation_steps: 3\n"
    )
    command = [sys.executable, "-m", "accelerando.commands.cli", "test", "--config_file", str(config)]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 process(es)" in result.stdout
    assert result.stdout.count("PASS:") == 2 and "accumulation steps 3" in result.stdout
    assert "accelerando test passed." in result.stdout
