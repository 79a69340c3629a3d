"""Config-file blocks the reference writes: each key is read into a setting or refused by name."""

from __future__ import annotations

import pytest

from accelerando.core.settings import resolve
from accelerando.core.settings.configfile import ConfigError, config_to_layer


def _layer(data: dict) -> dict:
    return {name: entry.value for name, entry in config_to_layer(data, "/x.yaml").items()}


def test_fsdp_block_reads_checkpointing_offload_and_ignored_modules() -> None:
    layer = _layer(
        {
            "distributed_type": "FSDP",
            "fsdp_config": {
                "fsdp_activation_checkpointing": True,
                "fsdp_activation_checkpointing_offload": True,
                "fsdp_ignored_modules": "lm_head|embed",
            },
        }
    )
    assert layer["fsdp_activation_checkpointing_offload"] is True
    assert layer["fsdp_ignored_modules"] == "lm_head|embed"
    assert layer["use_fsdp"] is True


@pytest.mark.parametrize("prefixed", [True, False])
def test_parallelism_block_sets_the_sizes_and_implies_use_parallelism_config(prefixed: bool) -> None:
    def key(axis: str) -> str:
        return f"parallelism_config_{axis}" if prefixed else axis

    block = {key("dp_shard_size"): 2, key("tp_size"): 1, key("cp_comm_strategy"): "alltoall"}
    block[key("sp_seq_length_is_variable")] = True
    layer = _layer({"parallelism_config": block})
    assert layer["parallelism_config_dp_shard_size"] == 2
    assert layer["parallelism_config_tp_size"] == 1
    assert layer["parallelism_config_cp_comm_strategy"] == "alltoall"
    assert layer["parallelism_config_sp_seq_length_is_variable"] is True
    assert layer["use_parallelism_config"] is True


def test_explicit_use_parallelism_config_false_wins_over_the_block() -> None:
    layer = _layer({"use_parallelism_config": False, "parallelism_config": {"parallelism_config_tp_size": 2}})
    assert layer["use_parallelism_config"] is False


def test_mpirun_block_as_the_reference_writes_it() -> None:
    layer = _layer({"mpirun_config": {"mpirun_ccl": "1", "mpirun_hostfile": "/home/user/hostfile"}})
    assert layer == {"mpirun_ccl": 1, "mpirun_hostfile": "/home/user/hostfile"}


def test_fp8_block_with_the_reference_key_names() -> None:
    te = {
        "amax_compute_algorithm": "max",
        "amax_history_length": 1024,
        "backend": "TE",
        "fp8_format": "HYBRID",
        "interval": 1,
        "margin": 0,
        "override_linear_precision": False,
        "use_autocast_during_eval": False,
    }
    layer = _layer({"mixed_precision": "fp8", "fp8_config": te})
    assert layer["fp8_backend"] == "te"
    assert layer["fp8_amax_compute_algo"] == "max"
    assert layer["fp8_amax_history_len"] == 1024
    assert (layer["fp8_format"], layer["fp8_interval"], layer["fp8_margin"]) == ("HYBRID", 1, 0)
    assert layer["fp8_override_linear_precision"] == "false"
    assert layer["fp8_use_autocast_during_eval"] is False
    msamp = _layer({"fp8_config": {"backend": "MSAMP", "opt_level": "O2"}})
    assert (msamp["fp8_backend"], msamp["fp8_opt_level"]) == ("msamp", "O2")


@pytest.mark.parametrize(
    ("data", "named"),
    [
        ({"fp8_config": {"backend": "XYZ"}}, "fp8_config.backend"),
        (
            {"parallelism_config": {"parallelism_config_tp_size": 0}},
            "parallelism_config.parallelism_config_tp_size",
        ),
        ({"mpirun_config": {"mpirun_ccl": "many"}}, "mpirun_config.mpirun_ccl"),
        (
            {"fsdp_config": {"fsdp_activation_checkpointing_offload": "maybe"}},
            "fsdp_activation_checkpointing_offload",
        ),
    ],
)
def test_a_bad_value_in_a_block_names_the_key(data: dict, named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        config_to_layer(data, "/x.yaml")


@pytest.mark.parametrize("block", ["fp8_config", "parallelism_config", "mpirun_config"])
def test_an_unknown_key_in_a_block_is_refused_with_a_close_match(block: str) -> None:
    close = {
        "fp8_config": "bakend",
        "parallelism_config": "tp_sise",
        "mpirun_config": "mpirun_hostfil",
    }
    with pytest.raises(ConfigError, match=rf"unknown key '{block}\.{close[block]}'.*Did you mean"):
        config_to_layer({block: {close[block]: 1}}, "/x.yaml")


@pytest.mark.parametrize("block", ["fp8_config", "parallelism_config", "mpirun_config"])
def test_a_block_that_is_not_a_mapping_is_refused_and_an_empty_one_is_fine(block: str) -> None:
    with pytest.raises(ConfigError, match=f"'{block}' must be a mapping"):
        config_to_layer({block: "yes"}, "/x.yaml")
    assert config_to_layer({block: None}, "/x.yaml") == {}
    assert config_to_layer({block: {}}, "/x.yaml") == {}


def test_block_values_resolve_with_their_config_source() -> None:
    settings = resolve([config_to_layer({"fp8_config": {"margin": 3}}, "/x.yaml")])
    assert settings.fp8_margin == 3
    assert settings.source("fp8_margin") == "config:/x.yaml"
