"""The `accelerando.commands.config` package: config dataclasses, `config default` and `config update`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from accelerando.commands.config import config_args, get_config_parser, load_config_from_file, main
from accelerando.commands.config.config_args import BaseConfig, ClusterConfig, SageMakerConfig
from accelerando.core.enums import ComputeEnvironment, DistributedType, SageMakerDistributedType
from accelerando.core.settings.configfile import ConfigError, load_config_layer

# What the reference's `accelerate config` writes for two GPUs with DeepSpeed.
REFERENCE_YAML = """\
compute_environment: LOCAL_MACHINE
debug: false
deepspeed_config:
  gradient_accumulation_steps: 2
  offload_optimizer_device: none
  offload_param_device: none
  zero3_init_flag: false
  zero_stage: 2
distributed_type: DEEPSPEED
downcast_bf16: 'no'
enable_cpu_affinity: false
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
use_cpu: false
"""


@pytest.fixture(autouse=True)
def clean_env(isolated_env: None) -> None:
    """No settings variable from the machine (see the root conftest)."""


def test_reference_file_loads_round_trips_and_stays_launchable(tmp_path: Path) -> None:
    path = tmp_path / "ref.yaml"
    path.write_text(REFERENCE_YAML)
    config = load_config_from_file(str(path))
    assert isinstance(config, ClusterConfig)
    assert config.compute_environment is ComputeEnvironment.LOCAL_MACHINE
    assert config.distributed_type is DistributedType.DEEPSPEED
    assert (config.num_processes, config.mixed_precision, config.deepspeed_config["zero_stage"]) == (
        2,
        "bf16",
        2,
    )
    data = config.to_dict()
    assert data["distributed_type"] == "DEEPSPEED" and type(data["distributed_type"]) is str
    assert "fsdp_config" not in data and "tpu_name" not in data  # empty and None values are left out
    as_json = tmp_path / "copy.json"
    config.to_json_file(as_json)
    assert json.loads(as_json.read_text())["num_processes"] == 2
    assert ClusterConfig.from_json_file(as_json) == config
    as_yaml = tmp_path / "sub" / "copy.yaml"
    config.to_yaml_file(as_yaml)
    assert ClusterConfig.from_yaml_file(as_yaml) == config
    assert load_config_layer(as_yaml)["use_deepspeed"].value is True


def test_own_keys_are_kept_and_unknown_keys_refused(tmp_path: Path) -> None:
    path = tmp_path / "own.yaml"
    path.write_text(
        "distributed_type: MULTI_CPU\nuse_cpu: true\nnum_processes: 2\ngradient_accumulation_steps: 4\n"
    )
    config = load_config_from_file(path)
    assert config.extra_settings == {"gradient_accumulation_steps": 4}
    assert config.to_dict()["gradient_accumulation_steps"] == 4
    path.write_text("distributed_type: 'NO'\nmixed_precison: fp16\n")
    with pytest.raises(ConfigError, match="mixed_precison"):
        load_config_from_file(path)
    path.write_text("distributed_type: 'NO'\nnum_processes: zero\n")
    with pytest.raises(ConfigError, match="num_processes"):
        load_config_from_file(path)
    path.write_text("distributed_type: SIDEWAYS\n")
    with pytest.raises(ConfigError, match="SIDEWAYS"):
        ClusterConfig.from_yaml_file(path)


def test_sagemaker_file_and_missing_files(tmp_path: Path) -> None:
    path = tmp_path / "sm.yaml"
    path.write_text(
        "compute_environment: AMAZON_SAGEMAKER\ndistributed_type: DATA_PARALLEL\nec2_instance_type: ml.p3.16xlarge\n"
        "iam_role_name: role\nmixed_precision: fp16\nnum_machines: 2\n"
    )
    config = load_config_from_file(path)
    assert isinstance(config, SageMakerConfig)
    assert config.distributed_type is SageMakerDistributedType.DATA_PARALLEL
    assert (config.region, config.base_job_name, config.num_machines) == (
        "us-east-1",
        "accelerate-sagemaker-1",
        2,
    )
    path.write_text("compute_environment: AMAZON_SAGEMAKER\ndistributed_type: 'NO'\n")
    with pytest.raises(ConfigError, match="iam_role_name"):
        load_config_from_file(path)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_config_from_file(tmp_path / "missing.yaml")
    with pytest.raises(FileNotFoundError, match="accelerando config"):
        load_config_from_file(None)  # no default file in this empty cache


def test_process_config_migrates_old_keys() -> None:
    old = {"fp16": True, "dynamo_backend": "INDUCTOR", "fsdp_config": {"fsdp_sharding_strategy": 2}}
    new = BaseConfig.process_config(old)
    assert new["mixed_precision"] == "fp16" and "fp16" not in new
    assert new["dynamo_config"] == {"dynamo_backend": "INDUCTOR"} and "dynamo_backend" not in new
    assert new["fsdp_config"] == {"fsdp_sharding_strategy": "SHARD_GRAD_OP"}
    assert (new["compute_environment"], new["use_cpu"], new["debug"]) == ("LOCAL_MACHINE", False, False)
    assert old["fp16"] is True  # the input is not modified


def test_config_update_rewrites_with_defaults(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = tmp_path / "old.yaml"
    old.write_text("distributed_type: MULTI_CPU\nfp16: false\ndynamo_backend: 'NO'\nnum_processes: 3\n")
    assert main(["update", "--config-file", str(old)]) == 0
    assert "Successfully updated" in capsys.readouterr().out
    data = yaml.safe_load(old.read_text())
    assert data["mixed_precision"] == "no" and "fp16" not in data and "dynamo_backend" not in data
    assert (data["compute_environment"], data["use_cpu"], data["debug"]) == ("LOCAL_MACHINE", False, False)
    assert (data["num_processes"], data["machine_rank"], data["rdzv_backend"]) == (3, 0, "static")
    before = old.read_text()
    assert main(["update", "--config_file", str(old)]) == 0
    assert old.read_text() == before  # idempotent
    assert load_config_layer(old)["num_processes"].value == 3
    assert main(["update"]) == 2  # no default file to update
    assert "accelerando config" in capsys.readouterr().err


def test_config_default_parser_forms(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "d.yaml"
    assert main(["default", "--save-location", str(target), "--mixed-precision", "fp16"]) == 0
    assert yaml.safe_load(target.read_text())["mixed_precision"] == "fp16"
    assert main(["--config_file", str(target), "default"]) == 1  # exists: kept
    assert "already exists" in capsys.readouterr().out
    args = get_config_parser().parse_args(["--config_file", "a.yaml", "default", "--config_file", "b.yaml"])
    assert args.config_file == "b.yaml" and args.config_command == "default"
    args = get_config_parser().parse_args(["--config_file", "a.yaml", "update"])
    assert args.config_file == "a.yaml" and args.config_command == "update"
    assert main(["default"]) == 0  # the default location
    assert Path(config_args.default_config_path()).is_file()
