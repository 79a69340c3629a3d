"""DeepSpeed without processes: the plugin, "auto" filling and its errors, the automatic ZeRO choice."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch

from accelerando import DeepSpeedPlugin
from accelerando.backends.strategies.deepspeed.auto_stage import choose_zero_config, estimate_zero_memory
from accelerando.backends.strategies.deepspeed.config import auto_keys, fill_auto, require_no_auto
from accelerando.backends.strategies.deepspeed.resolve import PrepareInputs, resolve_config, zero_init_config
from accelerando.backends.strategies.deepspeed.selection import (
    get_active_deepspeed_plugin,
    select_deepspeed_plugin,
)
from accelerando.utils.deepspeed import DummyOptim, DummyScheduler

GIB = 1024**3


@pytest.fixture(autouse=True)
def _no_launcher_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if (
            "DEEPSPEED" in name
            or name.endswith("GRADIENT_ACCUMULATION_STEPS")
            or name.endswith("GRADIENT_CLIPPING")
        ):
            monkeypatch.delenv(name)


def _inputs(model: Any = None, optimizer: Any = None, scheduler: Any = None, **kw: Any) -> PrepareInputs:
    model = model or torch.nn.Linear(4, 2)
    defaults = dict(
        batch_sizes=[8],
        num_processes=2,
        gradient_accumulation_steps=2,
        mixed_precision="no",
        device=torch.device("cpu"),
    )
    defaults.update(kw)
    return PrepareInputs(model=model, optimizer=optimizer, scheduler=scheduler, **defaults)


# ----------------------------------------------------------------------------- plugin
def test_plugin_from_fields_builds_a_config_with_auto_batch_sizes() -> None:
    plugin = DeepSpeedPlugin(zero_stage=3, gradient_clipping=1.0, offload_optimizer_device="cpu")
    cfg = plugin.deepspeed_config
    assert cfg["zero_optimization"]["stage"] == 3
    assert cfg["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    assert cfg["gradient_clipping"] == 1.0
    assert cfg["train_micro_batch_size_per_gpu"] == "auto"
    assert DeepSpeedPlugin().zero_stage == 2  # the default stage


def test_plugin_config_file_auto_is_filled_by_fields_and_conflicts_are_errors(tmp_path: Any) -> None:
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"zero_optimization": {"stage": "auto"}, "gradient_clipping": 0.5}))
    plugin = DeepSpeedPlugin(hf_ds_config=str(path), zero_stage=1)
    assert plugin.deepspeed_config["zero_optimization"]["stage"] == 1
    assert plugin.zero_stage == 1 and plugin.gradient_clipping == 0.5
    with pytest.raises(ValueError, match="gradient_clipping"):
        DeepSpeedPlugin(hf_ds_config=str(path), gradient_clipping=2.0)
    with pytest.raises(ValueError, match="does not exist"):
        DeepSpeedPlugin(hf_ds_config=str(tmp_path / "missing.json"))


def test_plugin_reads_launcher_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCELERANDO_DEEPSPEED_ZERO_STAGE", "3")
    monkeypatch.setenv("ACCELERANDO_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE", "cpu")
    plugin = DeepSpeedPlugin()
    assert plugin.zero_stage == 3
    assert plugin.deepspeed_config["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    assert DeepSpeedPlugin(zero_stage=1).zero_stage == 1  # code wins


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"zero_stage": 5}, "zero_stage"),
        ({"offload_param_device": "gpu"}, "offload_param_device"),
        ({"gradient_accumulation_steps": 0}, "gradient_accumulation_steps"),
        ({"msamp_opt_level": "O3"}, "msamp_opt_level"),
    ],
)
def test_plugin_rejects_bad_values(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        DeepSpeedPlugin(**kwargs)


def test_zero3_init_flag_is_ignored_below_stage_3() -> None:
    with pytest.warns(UserWarning, match="stage 3"):
        plugin = DeepSpeedPlugin(zero_stage=2, zero3_init_flag=True)
    assert not plugin.is_zero3_init_enabled()
    assert DeepSpeedPlugin(zero_stage=3, zero3_init_flag=True).is_zero3_init_enabled()


def test_select_and_active_plugin() -> None:
    class State:
        deepspeed_plugins = {"a": DeepSpeedPlugin(zero_stage=1), "b": DeepSpeedPlugin(zero_stage=3)}
        active_deepspeed_plugin_name = None

    state = State()
    assert get_active_deepspeed_plugin(state) is state.deepspeed_plugins["a"]
    select_deepspeed_plugin(state, "b")
    assert get_active_deepspeed_plugin(state) is state.deepspeed_plugins["b"]
    assert state.deepspeed_plugins["b"].selected and not state.deepspeed_plugins["a"].selected
    with pytest.raises(ValueError, match="no DeepSpeed plugin named 'c'"):
        select_deepspeed_plugin(state, "c")
    with pytest.raises(ValueError, match="select_deepspeed_plugin"):
        state.deepspeed_plugins["a"].select()
    state.deepspeed_plugins = None
    with pytest.raises(ValueError, match="DeepSpeed is not enabled"):
        get_active_deepspeed_plugin(state)


# ------------------------------------------------------------------------ auto filling
def test_fill_auto_never_overwrites_concrete_values() -> None:
    cfg = {"a": "auto", "b": 3, "c": {"d": "auto"}}
    assert fill_auto(cfg, {"a": 1, "b": 9, "c.d": None}) == ["a"]
    assert cfg == {"a": 1, "b": 3, "c": {"d": "auto"}}
    assert auto_keys(cfg) == ["c.d"]


def test_resolve_fills_batch_accumulation_precision_and_optimizer() -> None:
    plugin = DeepSpeedPlugin(
        hf_ds_config={
            "train_batch_size": "auto",
            "train_micro_batch_size_per_gpu": "auto",
            "gradient_accumulation_steps": "auto",
            "gradient_clipping": "auto",
            "bf16": {"enabled": "auto"},
            "optimizer": {
                "type": "AdamW",
                "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"},
            },
            "scheduler": {
                "type": "WarmupDecayLR",
                "params": {
                    "warmup_min_lr": "auto",
                    "warmup_max_lr": "auto",
                    "warmup_num_steps": "auto",
                    "total_num_steps": "auto",
                },
            },
        }
    )
    model = torch.nn.Linear(4, 2)
    opt = DummyOptim(model.parameters(), lr=3e-4, weight_decay=0.1, betas=(0.8, 0.9), eps=1e-6)
    sched = DummyScheduler(opt, total_num_steps=100, warmup_num_steps=10)
    cfg, choice = resolve_config(plugin, _inputs(model, opt, sched, mixed_precision="bf16"))
    assert choice is None
    assert (
        cfg["train_micro_batch_size_per_gpu"],
        cfg["gradient_accumulation_steps"],
        cfg["train_batch_size"],
    ) == (8, 2, 32)
    assert cfg["bf16"]["enabled"] is True and cfg["gradient_clipping"] == 0.0
    params = cfg["optimizer"]["params"]
    assert (params["lr"], params["weight_decay"], params["betas"], params["eps"]) == (
        3e-4,
        0.1,
        [0.8, 0.9],
        1e-6,
    )
    assert params["torch_adam"] is True  # no compiled op needed on CPU
    assert cfg["scheduler"]["params"] == {
        "warmup_min_lr": 0.0,
        "warmup_max_lr": 3e-4,
        "warmup_num_steps": 10,
        "total_num_steps": 100,
    }
    assert plugin.deepspeed_config["train_batch_size"] == "auto"  # the plugin's own config is untouched


def test_hidden_size_fills_bucket_sizes() -> None:
    model = torch.nn.Linear(4, 2)
    model.config = type("Config", (), {"hidden_size": 64})()
    plugin = DeepSpeedPlugin(
        hf_ds_config={
            "zero_optimization": {
                "stage": 3,
                "reduce_bucket_size": "auto",
                "stage3_prefetch_bucket_size": "auto",
                "stage3_param_persistence_threshold": "auto",
            },
            "train_micro_batch_size_per_gpu": "auto",
        }
    )
    cfg, _ = resolve_config(plugin, _inputs(model, torch.optim.SGD(model.parameters(), lr=0.1)))
    zero = cfg["zero_optimization"]
    assert (
        zero["reduce_bucket_size"],
        zero["stage3_prefetch_bucket_size"],
        zero["stage3_param_persistence_threshold"],
    ) == (4096, 3686, 640)


def test_unresolvable_auto_is_an_error_naming_the_key() -> None:
    plugin = DeepSpeedPlugin(
        hf_ds_config={
            "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto"},
            "train_micro_batch_size_per_gpu": "auto",
        }
    )
    with pytest.raises(
        ValueError, match=r"zero_optimization\.reduce_bucket_size: give the model a config\.hidden_size"
    ):
        resolve_config(plugin, _inputs())
    with pytest.raises(ValueError, match="train_micro_batch_size_per_gpu: pass a dataloader"):
        resolve_config(DeepSpeedPlugin(zero_stage=2), _inputs(batch_sizes=[]))
    with pytest.raises(ValueError, match="total_num_steps"):
        require_no_auto({"scheduler": {"params": {"total_num_steps": "auto"}}})


def test_batch_size_mismatch_between_config_and_dataloader() -> None:
    plugin = DeepSpeedPlugin(
        hf_ds_config={"train_micro_batch_size_per_gpu": 3, "zero_optimization": {"stage": 1}}
    )
    with pytest.raises(ValueError, match="train_micro_batch_size_per_gpu=3 but the dataloader gives 8"):
        resolve_config(plugin, _inputs())
    plugin = DeepSpeedPlugin(hf_ds_config={"train_batch_size": 10, "train_micro_batch_size_per_gpu": "auto"})
    with pytest.raises(ValueError, match="train_batch_size=10"):
        resolve_config(plugin, _inputs())


def test_smallest_or_largest_batch_size() -> None:
    cfg, _ = resolve_config(DeepSpeedPlugin(), _inputs(batch_sizes=[8, 4]))
    assert cfg["train_micro_batch_size_per_gpu"] == 4
    cfg, _ = resolve_config(
        DeepSpeedPlugin(is_train_batch_min=False), _inputs(batch_sizes=[8, 4], is_train_batch_min=False)
    )
    assert cfg["train_micro_batch_size_per_gpu"] == 8


def test_optimizer_and_scheduler_must_match_the_config_sections() -> None:
    model = torch.nn.Linear(4, 2)
    with pytest.raises(ValueError, match='DummyOptim needs an "optimizer" section'):
        resolve_config(DeepSpeedPlugin(), _inputs(model, DummyOptim(model.parameters())))
    with_opt = DeepSpeedPlugin(
        hf_ds_config={
            "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
            "train_micro_batch_size_per_gpu": "auto",
        }
    )
    with pytest.raises(ValueError, match="pass\\s+accelerando.utils.DummyOptim"):
        resolve_config(with_opt, _inputs(model, torch.optim.SGD(model.parameters(), lr=0.1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="DummyScheduler needs"):
        resolve_config(DeepSpeedPlugin(), _inputs(model, opt, DummyScheduler(opt)))
    cfg, _ = resolve_config(DeepSpeedPlugin(offload_optimizer_device="cpu"), _inputs(model, opt))
    # A script's torch optimizer runs under ZeRO and with offload without DeepSpeed's compiled ops.
    assert cfg["zero_allow_untested_optimizer"] is True and cfg["zero_force_ds_cpu_optimizer"] is False


def test_zero_init_config_drops_unresolved_auto() -> None:
    cfg = zero_init_config(DeepSpeedPlugin(zero_stage=3).deepspeed_config)
    assert auto_keys(cfg) == []
    assert cfg["train_micro_batch_size_per_gpu"] == 1 and cfg["fp16"]["enabled"] is False


def test_missing_deepspeed_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import accelerando.common.imports as imports
    from accelerando.backends.strategies.deepspeed import import_deepspeed

    monkeypatch.setattr(imports, "is_deepspeed_available", lambda: False)
    with pytest.raises(ImportError, match=r"pip install 'accelerando\[deepspeed\]'"):
        import_deepspeed()


# ---------------------------------------------------------------- automatic ZeRO choice
BILLION = 10**9


@pytest.mark.parametrize(
    ("params", "device_gib", "procs", "cpu_gib", "precision", "stage", "off_opt", "off_param", "reason"),
    [
        # fp32 Adam: 16 bytes/param unsharded.
        (BILLION, 80, 2, None, "no", 0, "none", "none", "ZeRO-0: model states need 14.90 GiB"),
        (BILLION, 16, 2, None, "no", 1, "none", "none", "ZeRO-1: "),
        (BILLION, 13, 2, None, "no", 2, "none", "none", "ZeRO-2: "),
        (BILLION, 10, 2, None, "no", 3, "none", "none", "ZeRO-3: model states need 7.45 GiB"),
        (BILLION, 10, 8, None, "no", 2, "none", "none", "ZeRO-2: "),
        (BILLION, 4, 2, 64, "no", 3, "cpu", "none", "with optimizer offload"),
        (BILLION, 1, 2, 64, "no", 3, "cpu", "cpu", "and parameter offload"),
        # One process: sharding saves nothing, so straight from stage 0 to offload.
        (BILLION, 16, 1, 64, "no", 2, "cpu", "none", "ZeRO-2 with optimizer offload"),
        # Mixed precision: 2-byte weights and gradients, 12-byte optimizer state.
        (BILLION, 24, 2, None, "bf16", 0, "none", "none", "ZeRO-0"),
        (BILLION, 12, 2, None, "bf16", 1, "none", "none", "ZeRO-1"),
        (10**6, 1, 4, None, "no", 0, "none", "none", "ZeRO-0"),
    ],
)
def test_automatic_zero_choice_table(
    params: int,
    device_gib: int,
    procs: int,
    cpu_gib: int | None,
    precision: str,
    stage: int,
    off_opt: str,
    off_param: str,
    reason: str,
) -> None:
    cpu = None if cpu_gib is None else cpu_gib * GIB
    choice = choose_zero_config(params, device_gib * GIB, procs, cpu, precision)
    assert (choice.stage, choice.offload_optimizer_device, choice.offload_param_device) == (
        stage,
        off_opt,
        off_param,
    )
    assert reason in choice.reason
    assert choice.device_bytes <= device_gib * GIB * 0.8


def test_automatic_choice_fails_clearly_when_nothing_fits() -> None:
    with pytest.raises(ValueError, match="do not fit even with ZeRO-3 and full CPU offload.*nvme"):
        choose_zero_config(BILLION, 1 * GIB, 2, cpu_memory=8 * GIB)


def test_memory_estimate_shards_what_each_stage_shards() -> None:
    p, n = 1000, 4
    assert estimate_zero_memory(p, n, 0) == (16000, 0)
    assert estimate_zero_memory(p, n, 1) == (4000 + 4000 + 2000, 0)
    assert estimate_zero_memory(p, n, 2) == (4000 + 1000 + 2000, 0)
    assert estimate_zero_memory(p, n, 3) == (4000, 0)
    with pytest.raises(ValueError, match="parameter offload needs ZeRO stage 3"):
        estimate_zero_memory(p, n, 2, offload_param=True)


def test_resolve_applies_auto_stage_and_offload() -> None:
    plugin = DeepSpeedPlugin(zero_stage="auto", offload_optimizer_device="auto")
    cfg, choice = resolve_config(plugin, _inputs(torch.nn.Linear(8, 8)))
    # A tiny model fits anywhere: no sharding, no offload.
    assert choice is not None and choice.stage == 0
    assert cfg["zero_optimization"]["stage"] == 0
    assert cfg["zero_optimization"]["offload_optimizer"]["device"] == "none"


# ----------------------------------------------------------------------------- wrappers
def test_optimizer_wrapper_defers_to_the_engine() -> None:
    from accelerando.backends.strategies.deepspeed.wrappers import (
        DeepSpeedOptimizerWrapper,
        DeepSpeedSchedulerWrapper,
    )

    model = torch.nn.Linear(2, 1)
    inner = torch.optim.SGD(model.parameters(), lr=0.1)
    opt = DeepSpeedOptimizerWrapper(inner)
    model(torch.ones(1, 2)).sum().backward()
    before = model.weight.detach().clone()
    opt.step()
    opt.zero_grad()
    # The engine steps and zeroes; the wrapper must do neither itself.
    assert torch.equal(model.weight, before) and model.weight.grad is not None
    marker = opt.state_dict()
    opt.load_state_dict(marker)  # the engine checkpoint holds the real state
    sched = DeepSpeedSchedulerWrapper(torch.optim.lr_scheduler.StepLR(inner, 1, 0.5), [opt])
    sched.step()
    assert sched.get_last_lr() == [0.1]


def test_launcher_value_contradicting_the_config_file_warns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCELERANDO_DEEPSPEED_ZERO_STAGE", "1")
    with pytest.warns(UserWarning, match="launcher's zero_stage=1 is ignored"):
        plugin = DeepSpeedPlugin(hf_ds_config={"zero_optimization": {"stage": 3}})
    assert plugin.zero_stage == 3


def test_offload_auto_at_a_fixed_stage_offloads_only_when_needed() -> None:
    plugin = DeepSpeedPlugin(zero_stage=3, offload_optimizer_device="auto", offload_param_device="auto")
    cfg, choice = resolve_config(plugin, _inputs(torch.nn.Linear(8, 8)))
    assert choice is not None and "ZeRO-3 (given) with no offload" in choice.reason
    assert cfg["zero_optimization"]["offload_optimizer"]["device"] == "none"
    assert cfg["zero_optimization"]["offload_param"]["device"] == "none"
