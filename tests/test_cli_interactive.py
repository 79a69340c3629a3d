"""`accelerando config` driven through a real pseudo-terminal, then used by `accelerando launch`."""

from __future__ import annotations

import os
import shutil
import sys

import pytest
import yaml

pexpect = pytest.importorskip("pexpect")
pytest.importorskip("questionary")

DOWN, ENTER, BACKSPACE = "\x1b[B", "\r", "\x7f"


def _cli() -> tuple[str, list[str]]:
    exe = shutil.which("accelerando")
    return (exe, []) if exe else (sys.executable, ["-m", "accelerando.commands.cli"])


@pytest.fixture
def env(tmp_path):
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE", "ACCELERANDO", "FSDP_"))}
    clean.update(XDG_CACHE_HOME=str(tmp_path / "cache"), HF_HOME=str(tmp_path / "hf"), TERM="xterm")
    clean["PROMPT_TOOLKIT_NO_CPR"] = "1"  # do not wait for cursor-position replies the test never sends
    clean["CUDA_VISIBLE_DEVICES"] = ""  # the questions depend on GPUs; make the machine CPU-only
    return clean


def test_interactive_config_writes_the_answers_and_launch_uses_them(tmp_path, env):
    target = tmp_path / "answers.yaml"
    exe, prefix = _cli()
    child = pexpect.spawn(exe, [*prefix, "config", "--config_file", str(target)], env=env,
                          encoding="utf-8", timeout=30, dimensions=(40, 120))  # fmt: skip
    child.expect("Which kind of training")
    child.send(DOWN + ENTER)  # multi-CPU
    child.expect("How many machines")
    child.send(ENTER)  # default 1
    child.expect("How many processes in total")
    child.send(BACKSPACE + "3" + ENTER)
    child.expect("Gradient accumulation steps")
    child.send(BACKSPACE + "0" + ENTER)  # invalid: re-asked, not written
    child.expect("integer >= 1")
    child.send(BACKSPACE + "2" + ENTER)
    child.expect("torch.compile")
    child.send("n")
    child.expect("debug mode")
    child.send("n")
    child.expect("Mixed precision")
    child.send(DOWN * 3 + ENTER)  # no, fp8, fp16, bf16
    child.expect("Config file written to")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0

    data = yaml.safe_load(target.read_text())
    assert data["distributed_type"] == "MULTI_CPU" and data["use_cpu"] is True
    assert data["num_processes"] == 3 and data["num_machines"] == 1
    assert data["gradient_accumulation_steps"] == 2 and data["mixed_precision"] == "bf16"
    assert data["debug"] is False

    from accelerando.commands import launch

    args = launch.parse(launch.build_parser(), ["--config_file", str(target), "t.py"])
    settings, _ = launch.resolve_launch_settings(args)
    assert (settings.num_processes, settings.source("num_processes")) == (3, f"config:{target}")
    assert settings.mixed_precision == "bf16" and settings.gradient_accumulation_steps == 2
    assert settings.cpu is True
