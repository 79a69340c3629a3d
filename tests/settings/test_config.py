"""Config files: the reference's keys load unchanged; bad files fail with the key and the fix."""

from __future__ import annotations

import json

import pytest
import yaml

from accelerando.commands import config as config_cmd
from accelerando.commands import launch
from accelerando.commands.cli import main as cli_main
from accelerando.core.settings.configfile import (
    ConfigError,
    find_config_file,
    load_config_layer,
    migrate_config,
    read_config_file,
)

REFERENCE_STYLE = """\
compute_environment: LOCAL_MACHINE
debug: false
distributed_type: FSDP
downcast_bf16: 'no'
enable_cpu_affinity: false
fsdp_config:
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_backward_prefetch: BACKWARD_PRE
  fsdp_cpu_ram_efficient_loading: true
  fsdp_forward_prefetch: false
  fsdp_offload_params: false
  fsdp_sharding_strategy: FULL_SHARD
  fsdp_state_dict_type: SHARDED_STATE_DICT
  fsdp_sync_module_states: true
  fsdp_transformer_layer_cls_to_wrap: BertLayer
  fsdp_use_orig_params: true
  fsdp_version: 1
machine_rank: 0
main_training_function: main
mixed_precision: bf16
num_machines: 1
num_processes: 2
rdzv_backend: static
same_network: true
tpu_env: []
tpu_use_cluster: false
tpu_use_sudo: false
use_cpu: true
"""


@pytest.fixture(autouse=True)
def clean_env(isolated_env: None) -> None:
    """No settings variable from the machine (see the root conftest)."""


def write(tmp_path, text, name="c.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_reference_default_config_loads_unchanged(tmp_path):
    layer = load_config_layer(write(tmp_path, REFERENCE_STYLE))
    values = {name: sourced.value for name, sourced in layer.items()}
    assert values["distributed_type"] == "FSDP" and values["use_fsdp"] is True
    assert values["mixed_precision"] == "bf16" and values["num_processes"] == 2 and values["cpu"] is True
    assert values["fsdp_version"] == "1" and values["fsdp_transformer_layer_cls_to_wrap"] == ("BertLayer",)
    assert values["downcast_bf16"] is False
    assert all(s.source == f"config:{tmp_path / 'c.yaml'}" for s in layer.values())


def test_json_config_and_bare_no(tmp_path):
    path = write(
        tmp_path, json.dumps({"mixed_precision": "fp16", "deepspeed_config": {"zero_stage": 2}}), "c.json"
    )
    layer = load_config_layer(path)
    assert layer["mixed_precision"].value == "fp16" and layer["zero_stage"].value == 2
    layer = load_config_layer(
        write(tmp_path, "mixed_precision: no\ndynamo_config:\n  dynamo_backend: inductor\n")
    )
    assert layer["mixed_precision"].value == "no"  # YAML reads a bare `no` as False
    assert layer["dynamo_backend"].value == "INDUCTOR"


BAD_CONFIGS = [
    ("mixed_precison: fp16\n", ["mixed_precison", "Did you mean 'mixed_precision'"]),
    (
        "fsdp_config:\n  fsdp_sharding_stratgy: FULL_SHARD\n",
        ["fsdp_sharding_stratgy", "fsdp_sharding_strategy"],
    ),
    ("mixed_precision: fp12\n", ["'mixed_precision'", "'fp16'", "'bf16'"]),
    ("num_processes: two\n", ["'num_processes'", "integer"]),
    ("num_processes: 0\n", ["'num_processes'", ">= 1"]),
    ("use_cpu: maybe\n", ["'use_cpu'", "true/false"]),
    ("deepspeed_config:\n  zero_stage: -1\n", ["zero_stage", ">= 0"]),
    ("distributed_type: MULTI_TPU\n", ["distributed_type", "'MULTI_GPU'"]),
    ("compute_environment: AMAZON_SAGEMAKER\n", ["compute_environment", "LOCAL_MACHINE"]),
    ("fsdp_config: 3\n", ["fsdp_config", "mapping"]),
    ("- a\n- b\n", ["mapping"]),
    ("mixed_precision: [fp16\n", ["cannot be parsed"]),
]


@pytest.mark.parametrize(("text", "needles"), BAD_CONFIGS)
def test_bad_config_names_file_key_and_fix(tmp_path, text, needles):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config_layer(path)
    message = str(info.value)
    assert str(path) in message
    for needle in needles:
        assert needle in message, message


@pytest.mark.parametrize(
    ("text", "needles"),
    [
        (
            "distributed_type: MULTI_GPU\nnum_processes: 2\n",
            ["distributed_type", "has none visible", "use_cpu"],
        ),
        ("num_machines: 2\nnum_processes: 3\nmain_process_ip: h\n", ["num_processes", "multiple"]),
        ("num_machines: 2\n", ["main_process_ip"]),
    ],
)
def test_impossible_config_combinations_fail_at_launch(tmp_path, capsys, monkeypatch, text, needles):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # no GPU, whatever the test machine has
    path = write(tmp_path, text)
    assert launch.main(["--config_file", str(path), "--dry-run", "t.py"]) == 2
    err = capsys.readouterr().err
    assert f"config:{path}" in err
    for needle in needles:
        assert needle in err


def test_precedence_config_env_cli(tmp_path, monkeypatch):
    path = write(
        tmp_path, "mixed_precision: fp16\nnum_processes: 2\nuse_cpu: true\ngradient_accumulation_steps: 4\n"
    )
    monkeypatch.setenv("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "3")
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "no")
    args = launch.parse(
        launch.build_parser(), ["--config_file", str(path), "--mixed_precision", "bf16", "t.py"]
    )
    settings, _ = launch.resolve_launch_settings(args)
    assert (settings.mixed_precision, settings.source("mixed_precision")) == ("bf16", "cli:--mixed_precision")
    assert settings.gradient_accumulation_steps == 3
    assert settings.source("gradient_accumulation_steps") == "env:ACCELERATE_GRADIENT_ACCUMULATION_STEPS"
    assert (settings.num_processes, settings.source("num_processes")) == (2, f"config:{path}")


def test_default_location_and_reference_fallback(tmp_path, monkeypatch):
    assert find_config_file() == (None, "")
    reference = tmp_path / "hf" / "accelerate" / "default_config.yaml"
    reference.parent.mkdir(parents=True)
    reference.write_text("mixed_precision: fp16\n")
    path, note = find_config_file()
    assert path == reference and "reference project's config" in note
    ours = config_cmd.write_basic_config("bf16")
    assert ours == tmp_path / "cache" / "accelerando" / "default_config.yaml"
    assert find_config_file() == (ours, "")
    assert config_cmd.write_basic_config() is False  # never overwrites
    with pytest.raises(ConfigError, match="does not exist"):
        find_config_file(tmp_path / "missing.yaml")


def test_write_basic_config_for_this_machine(tmp_path):
    path = config_cmd.write_basic_config("fp16", tmp_path / "basic.json")
    data = json.loads(path.read_text())
    assert data["mixed_precision"] == "fp16" and data["compute_environment"] == "LOCAL_MACHINE"
    assert load_config_layer(path)["mixed_precision"].value == "fp16"
    assert config_cmd.basic_config_values(gpu_count=4)["distributed_type"] == "MULTI_GPU"
    assert config_cmd.basic_config_values(gpu_count=4)["num_processes"] == 4
    with pytest.raises(ValueError, match="mixed_precision"):
        config_cmd.write_basic_config("fp12", tmp_path / "x.yaml")


def test_config_default_and_update_commands(tmp_path, capsys):
    target = tmp_path / "d.yaml"
    assert cli_main(["config", "default", "--config_file", str(target), "--mixed_precision", "bf16"]) == 0
    assert yaml.safe_load(target.read_text())["mixed_precision"] == "bf16"
    old = write(tmp_path, "dynamo_backend: INDUCTOR\nfsdp_config:\n  fsdp_sharding_strategy: 1\n"
                "  fsdp_backward_prefetch_policy: BACKWARD_PRE\nmixed_precision: fp16\n", "old.yaml")  # fmt: skip
    assert cli_main(["config", "update", "--config_file", str(old)]) == 0
    data = read_config_file(old)
    assert data["dynamo_config"] == {"dynamo_backend": "INDUCTOR"}
    assert data["fsdp_config"]["fsdp_sharding_strategy"] == "FULL_SHARD"
    assert data["fsdp_config"]["fsdp_backward_prefetch"] == "BACKWARD_PRE"
    assert data["mixed_precision"] == "fp16"
    assert migrate_config(data) == data  # idempotent
    assert cli_main(["config", "update", "--config_file", str(tmp_path / "nope.yaml")]) == 2


def test_reference_deepspeed_megatron_dynamo_sections(tmp_path):
    text = """\
compute_environment: LOCAL_MACHINE
distributed_type: DEEPSPEED
deepspeed_config:
  deepspeed_multinode_launcher: standard
  gradient_accumulation_steps: 4
  gradient_clipping: 1.0
  offload_optimizer_device: none
  offload_param_device: cpu
  zero3_init_flag: true
  zero3_save_16bit_model: false
  zero_stage: 3
dynamo_config:
  dynamo_backend: INDUCTOR
  dynamo_mode: max-autotune
  dynamo_use_fullgraph: false
  dynamo_use_dynamic: true
megatron_lm_config:
  megatron_lm_tp_degree: 2
  megatron_lm_sequence_parallelism: true
fsdp_config: {}
ipex_config:
  ipex: false
mpirun_config: {}
gpu_ids: 0,1
main_process_port: null
"""
    values = {k: s.value for k, s in load_config_layer(write(tmp_path, text)).items()}
    assert values["use_deepspeed"] is True and values["zero_stage"] == 3
    assert values["gradient_accumulation_steps"] == 4 and values["gradient_clipping"] == 1.0
    assert values["offload_param_device"] == "cpu" and values["zero3_init_flag"] is True
    assert values["dynamo_backend"] == "INDUCTOR" and values["dynamo_mode"] == "max-autotune"
    assert values["dynamo_use_dynamic"] is True
    assert values["megatron_lm_tp_degree"] == 2 and values["megatron_lm_sequence_parallelism"] is True
    assert values["gpu_ids"] == "0,1" and "main_process_port" not in values
