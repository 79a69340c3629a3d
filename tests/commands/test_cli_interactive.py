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


def _answer_in_process(keys: str, gpu_count: int):
    from prompt_toolkit.application import create_app_session
    from prompt_toolkit.input import create_pipe_input
    from prompt_toolkit.output import DummyOutput

    from accelerando.commands.config.questions import ask_questions

    with create_pipe_input() as pipe:
        pipe.send_text(keys)
        with create_app_session(input=pipe, output=DummyOutput()):
            return ask_questions(gpu_count=gpu_count)


def test_gpu_backend_questions_fsdp_and_deepspeed(tmp_path):
    from accelerando.core.settings.configfile import config_to_layer, settings_to_config

    fsdp_keys = (DOWN * 3 + ENTER) + ENTER + (BACKSPACE + "2" + ENTER) + ENTER  # FSDP, 1 machine, 2, all GPUs
    fsdp_keys += ENTER + (DOWN + ENTER) + ENTER + "y" + ENTER  # v2, SHARD_GRAD_OP, wrap, offload, state dict
    fsdp_keys += ENTER + "y" + ENTER + "n" + (DOWN * 3 + ENTER)  # gas 1, compile INDUCTOR, no debug, bf16
    values = _answer_in_process(fsdp_keys, gpu_count=4)
    assert values["distributed_type"] == "FSDP" and values["num_processes"] == 2
    assert values["fsdp_sharding_strategy"] == "SHARD_GRAD_OP" and values["fsdp_offload_params"] is True
    assert values["dynamo_backend"] == "INDUCTOR" and values["mixed_precision"] == "bf16"
    layer = config_to_layer(settings_to_config(values), "answers")
    assert layer["use_fsdp"].value is True and layer["fsdp_version"].value == "2"

    ds_keys = (DOWN * 4 + ENTER) + ENTER + ENTER + ENTER  # DeepSpeed, 1 machine, 4 processes, all GPUs
    ds_keys += (
        (BACKSPACE + "3" + ENTER) + (DOWN + ENTER) + ENTER
    )  # ZeRO-3, offload optimizer to cpu, clip 1.0
    ds_keys += ENTER + "n" + "n" + ENTER  # gas 1, no compile, no debug, precision no
    values = _answer_in_process(ds_keys, gpu_count=4)
    assert values["distributed_type"] == "DEEPSPEED" and values["num_processes"] == 4
    assert values["zero_stage"] == 3 and values["offload_optimizer_device"] == "cpu"
    assert values["gradient_clipping"] == 1.0 and values["mixed_precision"] == "no"
    assert config_to_layer(settings_to_config(values), "answers")["use_deepspeed"].value is True

    assert _answer_in_process("\x03", gpu_count=0) is None  # Ctrl-C cancels: nothing to write
