"""`accelerando to-fsdp2`: an FSDP1 config file in the reference's layout becomes an FSDP2 one."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import yaml

from accelerando.commands.cli import main
from accelerando.commands.to_fsdp2 import (
    ConversionStatus,
    convert_config_to_fsdp2,
    load_config,
    to_fsdp2_command,
    to_fsdp2_command_parser,
)
from accelerando.core.settings.configfile import load_config_layer

FSDP1 = """\
compute_environment: LOCAL_MACHINE
debug: false
distributed_type: FSDP
downcast_bf16: 'no'
enable_cpu_affinity: false
fsdp_config:
  fsdp_activation_checkpointing: false
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_backward_prefetch: BACKWARD_PRE
  fsdp_cpu_ram_efficient_loading: true
  fsdp_forward_prefetch: false
  fsdp_offload_params: false
  fsdp_sharding_strategy: SHARD_GRAD_OP
  fsdp_state_dict_type: SHARDED_STATE_DICT
  fsdp_sync_module_states: true
  fsdp_transformer_layer_cls_to_wrap: BertLayer
  fsdp_use_orig_params: true
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


@pytest.fixture
def fsdp1(tmp_path: Path) -> Path:
    path = tmp_path / "fsdp1.yaml"
    path.write_text(FSDP1)
    return path


def test_converts_keys_values_and_keeps_the_rest(fsdp1: Path, tmp_path: Path, caplog) -> None:
    out = tmp_path / "fsdp2.yaml"
    with caplog.at_level(logging.WARNING):
        assert main(["to-fsdp2", "--config_file", str(fsdp1), "--output_file", str(out)]) == 0
    data = yaml.safe_load(out.read_text())
    fsdp = data["fsdp_config"]
    assert fsdp["fsdp_version"] == 2 and fsdp["fsdp_reshard_after_forward"] is False  # SHARD_GRAD_OP
    for gone in ("fsdp_sharding_strategy", "fsdp_backward_prefetch", "fsdp_forward_prefetch",
                 "fsdp_sync_module_states", "fsdp_use_orig_params"):  # fmt: skip
        assert gone not in fsdp
        assert gone == "fsdp_sharding_strategy" or gone in caplog.text
    assert fsdp["fsdp_transformer_layer_cls_to_wrap"] == "BertLayer"
    assert fsdp["fsdp_cpu_ram_efficient_loading"] is True
    assert data["mixed_precision"] == "bf16" and data["num_processes"] == 2
    layer = load_config_layer(out)  # the launcher reads the result
    assert layer["fsdp_version"].value == "2" and layer["use_fsdp"].value is True
    assert yaml.safe_load(fsdp1.read_text()) == yaml.safe_load(FSDP1)  # input untouched


def test_output_rules_and_dash_spelling(fsdp1: Path, tmp_path: Path, capsys) -> None:
    assert main(["to-fsdp2", "--config_file", str(fsdp1)]) == 2
    assert "--output_file" in capsys.readouterr().err
    taken = tmp_path / "taken.yaml"
    taken.write_text("x: 1\n")
    assert main(["to-fsdp2", "--config-file", str(fsdp1), "--output-file", str(taken)]) == 2
    assert "already exists" in capsys.readouterr().err and taken.read_text() == "x: 1\n"
    assert main(["to-fsdp2", "--config-file", str(fsdp1), "--overwrite"]) == 0  # in place
    assert yaml.safe_load(fsdp1.read_text())["fsdp_config"]["fsdp_version"] == 2
    assert main(["to-fsdp2", "--config_file", str(tmp_path / "missing.yaml"), "--overwrite"]) == 2
    assert "not found" in capsys.readouterr().err


def test_function_raises_the_reference_exceptions(fsdp1: Path, tmp_path: Path, caplog) -> None:
    parser = to_fsdp2_command_parser()
    with pytest.raises(FileNotFoundError, match="not found"):
        to_fsdp2_command(parser.parse_args(["--config_file", str(tmp_path / "missing.yaml")]))
    with pytest.raises(ValueError, match="--output_file must be provided"):
        to_fsdp2_command(parser.parse_args(["--config_file", str(fsdp1)]))
    taken = tmp_path / "taken.yaml"
    taken.write_text("x: 1\n")
    with pytest.raises(FileExistsError, match="already exists"):
        to_fsdp2_command(parser.parse_args(["--config_file", str(fsdp1), "--output_file", str(taken)]))
    out = tmp_path / "out.yaml"
    assert to_fsdp2_command(parser.parse_args(["--config_file", str(fsdp1), "--output_file", str(out)])) == 0
    # The version is written and read back as the integer 2 (the reference's config classes read it so).
    from accelerando.commands.config.config_args import load_config_from_file

    assert load_config_from_file(str(out)).fsdp_config["fsdp_version"] == 2
    with caplog.at_level(logging.WARNING):
        to_fsdp2_command(parser.parse_args(["--config_file", str(out), "--overwrite"]))
    assert "Config already specifies FSDP2, skipping conversion..." in caplog.text


def test_convert_function_edge_cases() -> None:
    assert convert_config_to_fsdp2({"mixed_precision": "no"}) == {"mixed_precision": "no"}
    already = {"fsdp_config": {"fsdp_version": 2, "fsdp_reshard_after_forward": True}}
    assert convert_config_to_fsdp2(already) == already
    numeric = convert_config_to_fsdp2({"fsdp_config": {"fsdp_sharding_strategy": 1}})
    assert numeric["fsdp_config"] == {"fsdp_reshard_after_forward": True, "fsdp_version": 2}
    with pytest.raises(ValueError, match="not an FSDP1 sharding strategy"):
        convert_config_to_fsdp2({"fsdp_config": {"fsdp_sharding_strategy": "HALF_SHARD"}})
    assert {s.name for s in ConversionStatus} == {"NOT_YET_IMPLEMENTED", "REMOVED"}
    with pytest.raises(FileNotFoundError):
        load_config("/nonexistent/config.yaml")
