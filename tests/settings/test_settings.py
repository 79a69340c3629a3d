"""Tests of the settings table and the in-process resolver (no processes, no torch needed)."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

from accelerando.core.settings import (
    FIELDS,
    GROUPS,
    Settings,
    Sourced,
    get_field,
    parse_value,
    resolve,
    resolve_runtime_settings,
)


def test_defaults_when_nothing_is_set():
    s = resolve_runtime_settings(environ={})
    assert s.mixed_precision == "no"
    assert s.gradient_accumulation_steps == 1
    assert s.cpu is False
    assert s.dynamo_backend == "NO"
    assert s.distributed_type is None
    assert all(source == "default" for _, _, source in s.items())


def test_precedence_default_env_code():
    env = {"ACCELERATE_MIXED_PRECISION": "fp16", "ACCELERATE_GRADIENT_ACCUMULATION_STEPS": "4"}
    s = resolve_runtime_settings({"gradient_accumulation_steps": None}, environ=env)
    assert s.mixed_precision == "fp16"
    assert s.source("mixed_precision") == "env:ACCELERATE_MIXED_PRECISION"
    assert s.gradient_accumulation_steps == 4  # None in code means "not given"
    s = resolve_runtime_settings({"gradient_accumulation_steps": 8}, environ=env)
    assert s.gradient_accumulation_steps == 8
    assert s.source("gradient_accumulation_steps") == "code"


def test_our_env_names_win_over_the_reference_names():
    env = {"ACCELERANDO_MIXED_PRECISION": "bf16", "ACCELERATE_MIXED_PRECISION": "fp16"}
    s = resolve_runtime_settings(environ=env)
    assert (s.mixed_precision, s.source("mixed_precision")) == ("bf16", "env:ACCELERANDO_MIXED_PRECISION")


def test_reference_variables_for_backends():
    env = {
        "ACCELERATE_USE_FSDP": "true",
        "FSDP_SHARDING_STRATEGY": "2",  # the reference's older numeric spelling
        "FSDP_TRANSFORMER_CLS_TO_WRAP": "BertLayer, GPT2Block",
        "FSDP_OFFLOAD_PARAMS": "false",
        "FSDP_MIN_NUM_PARAMS": "100",
        "ACCELERATE_USE_DEEPSPEED": "1",
        "ACCELERATE_DEEPSPEED_ZERO_STAGE": "3",
        "ACCELERATE_DEEPSPEED_CONFIG_FILE": "/tmp/ds.json",
        "ACCELERATE_GRADIENT_CLIPPING": "1.5",
        "ACCELERATE_DEEPSPEED_ZERO3_INIT": "true",
        "ACCELERATE_DYNAMO_BACKEND": "inductor",
        "ACCELERATE_DYNAMO_USE_FULLGRAPH": "True",
        "ACCELERATE_DEBUG_MODE": "yes",
        "ACCELERATE_USE_CPU": "True",
    }
    s = resolve_runtime_settings(environ=env)
    fsdp = s.group("fsdp")
    assert s.use_fsdp is True
    assert fsdp["fsdp_sharding_strategy"] == "SHARD_GRAD_OP"
    assert fsdp["fsdp_transformer_layer_cls_to_wrap"] == ("BertLayer", "GPT2Block")
    assert fsdp["fsdp_offload_params"] is False
    assert fsdp["fsdp_min_num_params"] == 100
    ds = s.group("deepspeed")
    assert s.use_deepspeed is True
    assert ds["zero_stage"] == 3 and ds["gradient_clipping"] == 1.5 and ds["zero3_init_flag"] is True
    assert ds["deepspeed_config_file"] == "/tmp/ds.json"
    assert s.source("zero_stage") == "env:ACCELERATE_DEEPSPEED_ZERO_STAGE"
    assert s.dynamo_backend == "INDUCTOR" and s.dynamo_use_fullgraph is True
    assert s.debug is True and s.cpu is True


@pytest.mark.parametrize(
    ("code", "env", "names"),
    [
        ({"mixed_precision": "fp12"}, {}, ["mixed_precision", "code", "'bf16'"]),
        (
            {},
            {"ACCELERATE_MIXED_PRECISION": "half"},
            ["mixed_precision", "ACCELERATE_MIXED_PRECISION", "'fp16'"],
        ),
        ({}, {"ACCELERATE_GRADIENT_ACCUMULATION_STEPS": "abc"}, ["gradient_accumulation_steps", "integer"]),
        ({"gradient_accumulation_steps": 0}, {}, ["gradient_accumulation_steps", ">= 1"]),
        ({}, {"ACCELERATE_USE_CPU": "maybe"}, ["cpu", "env:ACCELERATE_USE_CPU", "true/false"]),
        ({}, {"FSDP_SHARDING_STRATEGY": "EVERYTHING"}, ["fsdp_sharding_strategy", "FULL_SHARD"]),
    ],
)
def test_invalid_values_name_setting_source_and_allowed_values(code, env, names):
    with pytest.raises(ValueError) as info:
        resolve_runtime_settings(code, environ=env)
    for name in names:
        assert name in str(info.value)
    assert "Fix:" in str(info.value)


def test_unknown_code_setting_suggests_close_name():
    with pytest.raises(KeyError, match="mixed_precision"):
        resolve_runtime_settings({"mixed_precisions": "fp16"}, environ={})


def test_code_overriding_env_logs_one_warning(caplog):
    env = {"ACCELERATE_MIXED_PRECISION": "fp16", "ACCELERATE_GRADIENT_ACCUMULATION_STEPS": "2"}
    with caplog.at_level(logging.WARNING, logger="accelerando.core.settings"):
        resolve_runtime_settings({"mixed_precision": "bf16", "gradient_accumulation_steps": 4}, environ=env)
    records = [r for r in caplog.records if r.name == "accelerando.core.settings"]
    assert len(records) == 1
    message = records[0].getMessage()
    assert "code" in message and "env:ACCELERATE_MIXED_PRECISION" in message
    assert "env:ACCELERATE_GRADIENT_ACCUMULATION_STEPS" in message
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="accelerando.core.settings"):
        resolve_runtime_settings({"mixed_precision": "fp16"}, environ=env)  # same value: no warning
    assert not [r for r in caplog.records if r.name == "accelerando.core.settings"]


def test_resolve_layers_in_order_with_provenance():
    config = {
        "mixed_precision": Sourced("fp16", "config:/x.yaml"),
        "num_processes": Sourced(4, "config:/x.yaml"),
    }
    cli = {"num_processes": Sourced("2", "cli:--num_processes"), "mixed_precision": Sourced(None, "cli:--x")}
    s = resolve([config, cli])
    assert s.num_processes == 2 and s.source("num_processes") == "cli:--num_processes"
    assert s.mixed_precision == "fp16" and s.source("mixed_precision") == "config:/x.yaml"
    rows = {name: (value, source) for name, value, source in s.items()}
    assert rows["num_processes"] == (2, "cli:--num_processes")
    assert len(rows) == len(FIELDS)


def test_settings_is_frozen_and_typed():
    s = resolve_runtime_settings(environ={})
    assert isinstance(s, Settings)
    with pytest.raises(AttributeError):
        s.mixed_precision = "fp16"  # type: ignore[misc]
    with pytest.raises(AttributeError):
        _ = s.not_a_setting
    with pytest.raises(ValueError, match="fsdp"):
        s.group("fsd")


def test_table_is_consistent():
    names = [f.name for f in FIELDS]
    assert len(names) == len(set(names))
    envs = [e for f in FIELDS for e in f.env_names]
    assert len(envs) == len(set(envs)), "one env variable must map to one setting"
    for f in FIELDS:
        assert f.our_env.startswith("ACCELERANDO_")
        if f.default is not None:
            assert parse_value(f, f.default) == f.default
        if f.kind == "choice":
            assert f.choices
    assert {"core", "launch", "dynamo", "fsdp", "deepspeed", "megatron"} <= set(GROUPS)
    assert get_field("zero_stage").our_env == "ACCELERANDO_DEEPSPEED_ZERO_STAGE"


def test_settings_module_does_not_import_torch():
    code = "import sys, accelerando.core.settings; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_only_rank_zero_warns_about_overrides(caplog):
    env = {"ACCELERATE_MIXED_PRECISION": "fp16", "RANK": "1"}
    with caplog.at_level(logging.WARNING, logger="accelerando.core.settings"):
        settings = resolve_runtime_settings({"mixed_precision": "bf16"}, environ=env)
    assert settings.mixed_precision == "bf16"
    assert not [r for r in caplog.records if r.name == "accelerando.core.settings"]


def test_fill_unset_copies_launcher_values_into_unset_plugin_fields():
    from dataclasses import dataclass

    from accelerando.core.settings import fill_unset

    @dataclass
    class Plugin:
        sharding_strategy: str | None = None
        offload_params: bool | None = True  # given in code: kept
        transformer_cls_names_to_wrap: list | None = None
        state_dict_type: str | None = None

    env = {
        "FSDP_SHARDING_STRATEGY": "NO_SHARD",
        "FSDP_OFFLOAD_PARAMS": "false",
        "FSDP_TRANSFORMER_CLS_TO_WRAP": "Block",
    }
    plugin = Plugin()
    filled = fill_unset(
        plugin,
        "fsdp",
        prefix="fsdp_",
        rename={"fsdp_transformer_layer_cls_to_wrap": "transformer_cls_names_to_wrap"},
        settings=resolve_runtime_settings(environ=env),
    )
    assert plugin == Plugin("NO_SHARD", True, ["Block"], None)
    assert filled == {
        "sharding_strategy": "env:FSDP_SHARDING_STRATEGY",
        "transformer_cls_names_to_wrap": "env:FSDP_TRANSFORMER_CLS_TO_WRAP",
    }
