"""The environment contract with the reference: the variables its launcher writes, and those it reads.

The expected dictionaries are the reference launcher's variables for the same flags (its documented
names and the exact text it writes); a real two-process launch dumps each process's environment and
is compared with them key by key.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from accelerando.core.settings import environment_setting, resolve_runtime_settings
from accelerando.core.settings.fields import FIELDS
from accelerando.core.settings.machine import MachineInfo
from accelerando.launchers.plan import Command, build

CPU_BOX = MachineInfo(gpu_count=0, cpu_count=4, python="py", omp_threads_set=True)

FSDP_FLAGS = [
    "--use_fsdp", "--fsdp_version", "2", "--fsdp_offload_params", "true", "--fsdp_min_num_params", "100",
    "--fsdp_sharding_strategy", "FULL_SHARD", "--fsdp_reshard_after_forward", "true",
    "--fsdp_auto_wrap_policy", "TRANSFORMER_BASED_WRAP", "--fsdp_transformer_layer_cls_to_wrap", "BertLayer",
    "--fsdp_backward_prefetch", "BACKWARD_PRE", "--fsdp_state_dict_type", "SHARDED_STATE_DICT",
    "--fsdp_forward_prefetch", "false", "--fsdp_use_orig_params", "true", "--fsdp_cpu_ram_efficient_loading",
    "true", "--fsdp_sync_module_states", "true", "--fsdp_activation_checkpointing", "true",
    "--fsdp_activation_checkpointing_offload", "true", "--mixed_precision", "bf16", "--debug",
]  # fmt: skip
# What the reference's launcher writes for FSDP_FLAGS.
REFERENCE_FSDP_ENV = {
    "ACCELERATE_DEBUG_MODE": "true",
    "ACCELERATE_DYNAMO_BACKEND": "NO",
    "ACCELERATE_DYNAMO_MODE": "default",
    "ACCELERATE_DYNAMO_USE_DYNAMIC": "False",
    "ACCELERATE_DYNAMO_USE_FULLGRAPH": "False",
    "ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION": "False",
    "ACCELERATE_MIXED_PRECISION": "bf16",
    "ACCELERATE_USE_FSDP": "true",
    "FSDP_ACTIVATION_CHECKPOINTING": "true",
    "FSDP_ACTIVATION_CHECKPOINTING_OFFLOAD": "true",
    "FSDP_AUTO_WRAP_POLICY": "TRANSFORMER_BASED_WRAP",
    "FSDP_BACKWARD_PREFETCH": "BACKWARD_PRE",
    "FSDP_CPU_RAM_EFFICIENT_LOADING": "true",
    "FSDP_FORWARD_PREFETCH": "false",
    "FSDP_MIN_NUM_PARAMS": "100",
    "FSDP_OFFLOAD_PARAMS": "true",
    "FSDP_RESHARD_AFTER_FORWARD": "true",
    "FSDP_SHARDING_STRATEGY": "FULL_SHARD",
    "FSDP_STATE_DICT_TYPE": "SHARDED_STATE_DICT",
    "FSDP_SYNC_MODULE_STATES": "true",
    "FSDP_TRANSFORMER_CLS_TO_WRAP": "BertLayer",
    "FSDP_USE_ORIG_PARAMS": "true",
    "FSDP_VERSION": "2",
}
# Reference variables we write beyond that launch's: ones this launch also sets, each with the
# reference's meaning (the reference reads them too).
EXTRA_ALLOWED = {"ACCELERATE_USE_CPU", "ACCELERATE_NUM_PROCESSES"}

DUMP = """\
import json, os, sys
from accelerando.core.settings import resolve_runtime_settings
names = ("ACCELERATE", "FSDP", "PARALLELISM", "MEGATRON")
env = {k: v for k, v in os.environ.items() if k.startswith(names)}
s = resolve_runtime_settings()
seen = {n: [str(s[n]), s.source(n)] for n in ("mixed_precision", "dynamo_backend", "fsdp_activation_checkpointing_offload")}
with open(os.path.join(sys.argv[1], "rank" + os.environ.get("RANK", "0") + ".json"), "w") as handle:
    json.dump({"env": env, "settings": seen}, handle)
"""


def test_a_real_launch_exports_the_reference_environment_key_by_key(tmp_path: Path) -> None:
    script = tmp_path / "dump.py"
    script.write_text(DUMP)
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE", "ACCELERANDO", "FSDP_"))}
    clean["ACCELERANDO_CONFIG_FILE"] = os.devnull
    argv = ["--cpu", "--num_processes", "2", "--num_cpu_threads_per_process", "1", *FSDP_FLAGS]
    done = subprocess.run(
        [sys.executable, "-m", "accelerando.commands.launch", *argv, str(script), str(tmp_path)],
        env=clean,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    for rank in (0, 1):
        report = json.loads((tmp_path / f"rank{rank}.json").read_text())
        env = report["env"]
        for key, value in REFERENCE_FSDP_ENV.items():
            assert env.get(key) == value, (rank, key)
        extra = set(env) - set(REFERENCE_FSDP_ENV) - EXTRA_ALLOWED
        assert extra == set(), extra
        settings = report["settings"]
        assert settings["mixed_precision"] == ["bf16", "env:ACCELERANDO_MIXED_PRECISION"]
        # Written because the reference always writes it, but read as the default it is.
        assert settings["dynamo_backend"] == ["NO", "default"]
        assert settings["fsdp_activation_checkpointing_offload"] == [
            "True",
            "env:ACCELERANDO_FSDP_ACTIVATION_CHECKPOINTING_OFFLOAD",
        ]


def _plan_env(argv: list[str]) -> dict[str, str]:
    from accelerando.commands import launch

    args = launch.parse(launch.build_parser(), [*argv, "train.py"])
    settings = launch.resolve_launch_settings(args)[0]
    return dict(build(settings, Command("train.py"), CPU_BOX, port=lambda: 29500).env)


def test_deepspeed_environment_matches_the_reference(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("ACCELERANDO_CONFIG_FILE", os.devnull)
    argv = [
        "--use_deepspeed", "--zero_stage", "2", "--offload_optimizer_device", "cpu", "--offload_param_device",
        "none", "--gradient_accumulation_steps", "3", "--gradient_clipping", "1.0", "--zero3_init_flag", "true",
        "--zero3_save_16bit_model", "true", "--deepspeed_moe_layer_cls_names", "A,B",
    ]  # fmt: skip
    expected = {
        "ACCELERATE_CONFIG_DS_FIELDS": "",
        "ACCELERATE_DEEPSPEED_MOE_LAYER_CLS_NAMES": "A,B",
        "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE": "cpu",
        "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE": "none",
        "ACCELERATE_DEEPSPEED_ZERO3_INIT": "true",
        "ACCELERATE_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL": "true",
        "ACCELERATE_DEEPSPEED_ZERO_STAGE": "2",
        "ACCELERATE_GRADIENT_ACCUMULATION_STEPS": "3",
        "ACCELERATE_GRADIENT_CLIPPING": "1.0",
        "ACCELERATE_MIXED_PRECISION": "no",
        "ACCELERATE_USE_DEEPSPEED": "true",
    }
    env = _plan_env(argv)
    for key, value in expected.items():
        assert env.get(key) == value, key


def test_simple_launch_dynamo_megatron_parallelism_and_affinity_spellings(
    tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setenv("ACCELERANDO_CONFIG_FILE", os.devnull)
    env = _plan_env(
        ["--cpu", "--dynamo_backend", "inductor", "--dynamo_use_fullgraph", "--enable_cpu_affinity"]
    )
    assert env["ACCELERATE_USE_CPU"] == "True"
    assert (env["ACCELERATE_DYNAMO_BACKEND"], env["ACCELERATE_DYNAMO_USE_FULLGRAPH"]) == ("INDUCTOR", "True")
    assert (env["ACCELERATE_DYNAMO_USE_DYNAMIC"], env["ACCELERATE_CPU_AFFINITY"]) == ("False", "1")
    env = _plan_env(
        ["--use_megatron_lm", "--megatron_lm_tp_degree", "2", "--megatron_lm_sequence_parallelism", "true"]
    )
    assert (env["ACCELERATE_USE_MEGATRON_LM"], env["MEGATRON_LM_TP_DEGREE"]) == ("true", "2")
    assert env["MEGATRON_LM_SEQUENCE_PARALLELISM"] == "true"
    env = _plan_env(["--use_fsdp", "--use_parallelism_config", "--parallelism_config_dp_shard_size", "2",
                     "--parallelism_config_cp_backend", "torch"])  # fmt: skip
    assert env["ACCELERATE_USE_PARALLELISM_CONFIG"] == "true"
    assert (env["PARALLELISM_CONFIG_DP_SHARD_SIZE"], env["PARALLELISM_CONFIG_CP_BACKEND"]) == ("2", "torch")


def test_an_echoed_default_changed_by_the_script_counts_as_set() -> None:
    launched = {
        "ACCELERATE_MIXED_PRECISION": "no",
        "ACCELERANDO_ECHOED_DEFAULTS": '{"ACCELERATE_MIXED_PRECISION": "no"}',
    }
    assert resolve_runtime_settings(environ=launched).source("mixed_precision") == "default"
    changed = {**launched, "ACCELERATE_MIXED_PRECISION": "fp16"}  # os.environ[...] = "fp16" in the script
    settings = resolve_runtime_settings(environ=changed)
    assert (settings.mixed_precision, settings.source("mixed_precision")) == (
        "fp16",
        "env:ACCELERATE_MIXED_PRECISION",
    )


# Every reference variable that only its environment sets (no flag, no config key), with a value.
REFERENCE_ONLY = {
    "ACCELERATE_INIT_INCLUDE_BUFFERS": ("true", True),
    "ACCELERATE_TORCH_DEVICE": ("cpu", "cpu"),
    "ACCELERATE_BYPASS_DEVICE_MAP": ("true", True),
    "ACCELERATE_ALLOW_CP_STANDALONE": ("1", True),
    "ACCELERATE_ENABLE_RICH": ("yes", True),
    "ACCELERATE_DEBUG_RDV_FILE": ("/tmp/rdv", "/tmp/rdv"),
    "ACCELERATE_IN_TPU_POD": ("false", False),
    "ACCELERATE_USE_SAGEMAKER": ("false", False),
    "ACCELERATE_SAGEMAKER_DISTRIBUTED_TYPE": ("DATA_PARALLEL", "DATA_PARALLEL"),
    "ACCELERATE_CONFIG_DS_FIELDS": ("zero_stage,gradient_clipping", ("zero_stage", "gradient_clipping")),
    "ACCELERATE_USE_PARALLELISM_CONFIG": ("true", True),
    "FSDP_ACTIVATION_CHECKPOINTING_OFFLOAD": ("true", True),
    "FSDP_IGNORED_MODULES": ("head", "head"),
    "ACCELERATE_FP8_BACKEND": ("TE", "te"),
    "ACCELERATE_FP8_OPT_LEVEL": ("O1", "O1"),
    "ACCELERATE_FP8_MARGIN": ("2", 2),
    "MEGATRON_LM_TP_DEGREE": ("2", 2),
    "PARALLELISM_CONFIG_SP_SEQ_LENGTH": ("128", 128),
}


@pytest.mark.parametrize("variable", sorted(REFERENCE_ONLY))
def test_every_formerly_ignored_reference_variable_resolves(variable: str, monkeypatch) -> None:
    raw, expected = REFERENCE_ONLY[variable]
    field = next(f for f in FIELDS if variable in f.env)
    assert environment_setting(field.name) == field.default
    monkeypatch.setenv(variable, raw)
    assert environment_setting(field.name) == expected
    assert resolve_runtime_settings().source(field.name) == f"env:{variable}"


def test_formerly_ignored_variables_change_what_the_launcher_does(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("ACCELERANDO_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("ACCELERATE_IN_TPU_POD", "true")
    with pytest.raises(ValueError, match="TPU pod"):
        _plan_env([])
    monkeypatch.delenv("ACCELERATE_IN_TPU_POD")
    monkeypatch.setenv("ACCELERATE_USE_PARALLELISM_CONFIG", "true")
    with pytest.raises(ValueError, match="env:ACCELERATE_USE_PARALLELISM_CONFIG.*Fix: add --use_fsdp"):
        _plan_env([])
    monkeypatch.setenv("PARALLELISM_CONFIG_TP_SIZE", "2")
    env = _plan_env(["--use_fsdp"])
    assert env["ACCELERANDO_PARALLELISM_CONFIG_TP_SIZE"] == env["PARALLELISM_CONFIG_TP_SIZE"] == "2"


def test_megatron_and_fsdp_plugins_take_the_reference_variables(monkeypatch) -> None:
    from accelerando.plugins.fsdp import FullyShardedDataParallelPlugin
    from accelerando.plugins.megatron import MegatronLMPlugin

    monkeypatch.setenv("MEGATRON_LM_TP_DEGREE", "2")
    monkeypatch.setenv("FSDP_IGNORED_MODULES", "head")
    assert MegatronLMPlugin().tp_degree == 2
    assert FullyShardedDataParallelPlugin().ignored_modules == "head"
