"""DeepSpeed in two real CPU processes (gloo): ZeRO 1-3 against a plain reference, configs, saving.

Each launch costs seconds (deepspeed import + engine builds), so one function per rank runs many
checks and returns its observations; the tests assert on them. The reference is computed in every
process without communication: the same model trained on the concatenation of both ranks' batches,
which is what data-parallel training with averaged gradients computes.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from accelerando.common.imports import is_deepspeed_available
from suite_support import fresh_accelerator, run_distributed_preloaded

pytestmark = [
    pytest.mark.skipif(not is_deepspeed_available(), reason="needs deepspeed (pip install deepspeed)"),
    pytest.mark.usefixtures("deepspeed_cpu_op"),
]

ENV = {"OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu", "PYTHONWARNINGS": "ignore::FutureWarning"}
MICRO, STEPS, LR = 4, 10, 0.05


def _model() -> Any:
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.Tanh(), torch.nn.Linear(12, 1))


def _batch(step: int, micro: int, rank: int) -> tuple[Any, Any]:
    import torch

    g = torch.Generator().manual_seed(1000 * step + 10 * micro + rank)
    x = torch.randn(MICRO, 6, generator=g)
    return x, x.sum(1, keepdim=True) * 0.3


def _loader() -> Any:
    import torch

    data = torch.utils.data.TensorDataset(torch.zeros(64, 6), torch.zeros(64, 1))
    return torch.utils.data.DataLoader(data, batch_size=MICRO)


def _reference(
    gas: int, world: int, opt_name: str = "sgd"
) -> tuple[list[float], list[float], dict[str, Any]]:
    """Losses and gradient norms of plain training on all ranks' data; final weights."""
    import torch

    model = _model()
    opt = (
        torch.optim.SGD(model.parameters(), lr=LR)
        if opt_name == "sgd"
        else torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)
    )
    losses, norms = [], []
    for step in range(STEPS):
        total = 0.0
        for micro in range(gas):
            for rank in range(world):
                x, y = _batch(step, micro, rank)
                loss = ((model(x) - y) ** 2).mean()
                (loss / (gas * world)).backward()
                total += loss.item() / (gas * world)
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9)))
        opt.step()
        opt.zero_grad()
        losses.append(total)
    return losses, norms, {k: v.clone() for k, v in model.state_dict().items()}


def _train(
    acc: Any, model: Any, opt: Any, gas: int, steps: int, start: int = 0
) -> tuple[list[float], list[float]]:
    """Train ``steps`` optimizer steps; return this rank's mean losses per step (all-reduced) and norms."""
    import torch

    losses, norms = [], []
    for step in range(start, start + steps):
        total = torch.zeros(())
        for micro in range(gas):
            x, y = _batch(step, micro, acc.process_index)
            with acc.accumulate(model):
                loss = ((model(x) - y) ** 2).mean()
                acc.backward(loss)
                opt.step()
                opt.zero_grad()
            total += loss.detach() / gas
        losses.append(float(acc.reduce(total, reduction="mean")))
        norm = acc.deepspeed_engine_wrapped.get_global_grad_norm()
        norms.append(norm)
    return losses, norms


def _stage_run(stage: int, gas: int, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    import torch

    from accelerando import DeepSpeedPlugin

    plugin = DeepSpeedPlugin(zero_stage=stage, gradient_clipping=1e9, **(extra or {}))
    acc = fresh_accelerator(deepspeed_plugin=plugin, gradient_accumulation_steps=gas)
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    model, opt, _ = acc.prepare(model, opt, _loader())
    losses, norms = _train(acc, model, opt, gas, STEPS)
    weights = acc.get_state_dict(model)
    acc._strategy.release()  # engines are destroyed between runs of one process
    return {"losses": losses, "norms": norms, "weights": weights, "type": str(acc.distributed_type)}


def _bf16_run() -> dict[str, Any]:
    """ZeRO-2 with mixed_precision="bf16": DeepSpeed keeps bf16 weights, autocast meets fp32 inputs."""
    import torch

    from accelerando import DeepSpeedPlugin

    acc = fresh_accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=2), mixed_precision="bf16")
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    model, opt, _ = acc.prepare(model, opt, _loader())
    x, _ = _batch(0, 0, acc.process_index)
    out_dtype = str(model(x).dtype)
    losses, _ = _train(acc, model, opt, 1, STEPS)
    param_dtype = str(next(model.module.parameters()).dtype)
    acc._strategy.release()
    return {"losses": losses, "param_dtype": param_dtype, "out_dtype": out_dtype, "scaler": acc.scaler}


def _stages_per_rank() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for stage in (1, 2, 3):
        for gas in (1, 4):
            out[f"z{stage}_gas{gas}"] = _stage_run(stage, gas)
    out["z2_offload"] = _stage_run(2, 1, {"offload_optimizer_device": "cpu"})
    out["z3_offload"] = _stage_run(3, 1, {"offload_optimizer_device": "cpu"})
    out["z2_bf16"] = _bf16_run()
    return out


def _close(a: Any, b: Any, tol: float = 1e-4) -> bool:
    return all(abs(x - y) <= tol * max(1.0, abs(y)) for x, y in zip(a, b, strict=True))


AUTO_CONFIG = {
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
    "fp16": {"enabled": "auto"},
    "bf16": {"enabled": "auto"},
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto"}},
    "zero_optimization": {"stage": 2, "reduce_bucket_size": 500000000},
}
CONCRETE_CONFIG = {
    "train_batch_size": MICRO * 2 * 2,
    "train_micro_batch_size_per_gpu": MICRO,
    "gradient_accumulation_steps": 2,
    "gradient_clipping": 1e9,
    "zero_optimization": {"stage": 3},
}


def _config_run(config: dict[str, Any], from_config: bool, gas: int) -> dict[str, Any]:
    import torch

    from accelerando import DeepSpeedPlugin
    from accelerando.utils import DummyOptim

    acc = fresh_accelerator(
        deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=config), gradient_accumulation_steps=gas
    )
    model = _model()
    if from_config:
        opt = DummyOptim(model.parameters(), lr=LR, weight_decay=0.01)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=LR)
    model, opt, _ = acc.prepare(model, opt, _loader())
    losses, _ = _train(acc, model, opt, acc.gradient_accumulation_steps, STEPS)
    return {"losses": losses, "gas": acc.gradient_accumulation_steps}


def _dummy_scheduler_run() -> dict[str, Any]:
    """Optimizer and warm-up schedule both from the config, through DummyOptim / DummyScheduler."""
    from accelerando import DeepSpeedPlugin
    from accelerando.utils import DummyOptim, DummyScheduler

    config = dict(AUTO_CONFIG)
    config["scheduler"] = {
        "type": "WarmupLR",
        "params": {
            "warmup_min_lr": "auto",
            "warmup_max_lr": "auto",
            "warmup_num_steps": "auto",
            "warmup_type": "linear",
        },
    }
    acc = fresh_accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=config))
    model = _model()
    opt = DummyOptim(model.parameters(), lr=LR, weight_decay=0.01)
    sched = DummyScheduler(opt, warmup_num_steps=4)
    model, opt, sched, _ = acc.prepare(model, opt, sched, _loader())
    lrs = []
    for step in range(6):
        x, y = _batch(step, 0, acc.process_index)
        acc.backward(((model(x) - y) ** 2).mean())
        opt.step()
        sched.step()
        opt.zero_grad()
        lrs.append(sched.get_last_lr()[0])
    return {"lrs": lrs, "types": (type(opt).__name__, type(sched).__name__)}


def _two_plugins(tmp: str) -> dict[str, Any]:
    """A trained ZeRO-2 student and a frozen ZeRO-3 teacher built under zero.Init; ZeRO-3 save_model."""
    import torch

    from accelerando import DeepSpeedPlugin
    from accelerando.backends.strategies.deepspeed.selection import (
        get_active_deepspeed_plugin,
        select_deepspeed_plugin,
    )

    plugins = {
        "student": DeepSpeedPlugin(zero_stage=2),
        "teacher": DeepSpeedPlugin(zero_stage=3, zero3_init_flag=True, hf_ds_config=None),
    }
    acc = fresh_accelerator(deepspeed_plugins=plugins)
    out: dict[str, Any] = {"first_active": get_active_deepspeed_plugin(acc.state) is plugins["student"]}
    student = _model()
    opt = torch.optim.SGD(student.parameters(), lr=LR)
    student, opt, _ = acc.prepare(student, opt, _loader())
    select_deepspeed_plugin(acc.state, "teacher")
    out["teacher_active"] = acc.deepspeed_plugin is plugins["teacher"]
    with plugins["teacher"].zero3_init_context_manager():
        teacher = _model()
    out["teacher_sharded"] = all(hasattr(p, "ds_id") for p in teacher.parameters())
    teacher = acc.prepare(teacher)
    x, y = _batch(0, 0, acc.process_index)
    with torch.no_grad():
        target = teacher(x)
    loss = ((student(x) - target) ** 2).mean()
    acc.backward(loss)
    opt.step()
    out["student_stage"] = student.zero_optimization_stage()
    out["teacher_stage"] = teacher.zero_optimization_stage()
    # ZeRO-3 save_model gathers the shards into one safetensors file.
    acc.save_model(teacher, os.path.join(tmp, "teacher"))
    out["teacher_out"] = teacher(x).detach()
    out["x"] = x
    return out


def _checkpoint_run(tmp: str, phase: str) -> dict[str, Any]:
    """phase "full": 10 steps, saving at 5. phase "resume": load the step-5 checkpoint, 5 more steps."""
    import torch

    from accelerando import DeepSpeedPlugin

    acc = fresh_accelerator(
        deepspeed_plugin=DeepSpeedPlugin(zero_stage=3, gradient_clipping=1.0), gradient_accumulation_steps=2
    )
    torch.manual_seed(123 if phase == "resume" else 0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.Tanh(), torch.nn.Linear(12, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    model, opt, sched, _ = acc.prepare(model, opt, sched, _loader())
    folder = os.path.join(tmp, "ckpt")
    if phase == "full":
        first, _ = _train(acc, model, opt, 2, 5)
        acc.save_state(folder)
        rest, _ = _train(acc, model, opt, 2, 5, start=5)
        losses = first + rest
    else:
        acc.load_state(folder)
        losses = _train(acc, model, opt, 2, 5, start=5)[0]
    return {"losses": losses, "weights": acc.get_state_dict(model), "lr": sched.get_last_lr()}


def _all_checks_per_rank(tmp: str) -> dict[str, Any]:
    out = _stages_per_rank()
    out.update(
        {
            "auto_from_config": _config_run(AUTO_CONFIG, True, 1),
            "concrete_from_script": _config_run(CONCRETE_CONFIG, False, 1),
            "dummy_scheduler": _dummy_scheduler_run(),
            "plugins": _two_plugins(tmp),
            "full": _checkpoint_run(tmp, "full"),
        }
    )
    return out


def _resume_per_rank(tmp: str) -> dict[str, Any]:
    return _checkpoint_run(tmp, "resume")


@pytest.fixture(scope="module")
def launched(tmp_path_factory: Any) -> tuple[dict[str, Any], Any]:
    """One 2-process launch running every check; (rank 0's observations, its folder)."""
    tmp = tmp_path_factory.mktemp("deepspeed")
    return run_distributed_preloaded(_all_checks_per_rank, 2, str(tmp), env=ENV)[0], tmp


def test_zero_stages_match_plain_training_with_and_without_accumulation(launched: Any) -> None:
    main, _ = launched
    for gas in (1, 4):
        ref_losses, ref_norms, ref_weights = _reference(gas, 2)
        for stage in (1, 2, 3):
            got = main[f"z{stage}_gas{gas}"]
            assert got["type"].endswith("DEEPSPEED")
            assert _close(got["losses"], ref_losses), (stage, gas, got["losses"], ref_losses)
            # The engine divides by the accumulation steps once: a double division would shrink
            # the gradient norm by a factor gas.
            assert _close(got["norms"], ref_norms, 1e-3), (stage, gas, got["norms"], ref_norms)
            for key, value in ref_weights.items():
                assert (got["weights"][key] - value).abs().max() < 1e-4, (stage, gas, key)


def test_cpu_offload_of_optimizer_state_trains(launched: Any) -> None:
    main, _ = launched
    ref_losses, _, _ = _reference(1, 2)
    for name in ("z2_offload", "z3_offload"):
        assert _close(main[name]["losses"], ref_losses), name


def test_config_with_auto_values_and_config_optimizer(launched: Any) -> None:
    main, _ = launched
    # "auto" batch sizes / accumulation / lr / weight decay; DeepSpeed's AdamW (torch's, on CPU).
    assert _close(main["auto_from_config"]["losses"], _reference(1, 2, "adamw")[0], 1e-3)


def test_dummy_optimizer_and_scheduler_from_config(launched: Any) -> None:
    main, _ = launched
    got = main["dummy_scheduler"]
    assert got["types"] == ("DeepSpeedOptimizerWrapper", "DeepSpeedSchedulerWrapper")
    lrs = got["lrs"]
    # Linear warm-up from 0 to the DummyOptim's lr over 4 steps, stepped once per step by the engine
    # (the wrapper's own step() must not advance it again).
    assert lrs == pytest.approx([LR * min(i, 4) / 4 for i in range(6)])


def test_concrete_config_with_script_optimizer(launched: Any) -> None:
    main, _ = launched
    # The config's accumulation (2) replaces the Accelerator's (1).
    assert main["concrete_from_script"]["gas"] == 2
    assert _close(main["concrete_from_script"]["losses"], _reference(2, 2)[0])


def test_two_plugins_and_zero3_save_model(launched: Any) -> None:
    import torch
    from safetensors.torch import load_file

    main, tmp = launched
    plugins = main["plugins"]
    assert plugins["first_active"] and plugins["teacher_active"] and plugins["teacher_sharded"]
    assert (plugins["student_stage"], plugins["teacher_stage"]) == (2, 3)
    weights = load_file(str(tmp / "teacher" / "model.safetensors"))
    plain = _model()
    plain.load_state_dict(weights)
    assert torch.allclose(plain(plugins["x"]), plugins["teacher_out"], atol=1e-6)


def test_save_state_then_fresh_processes_resume_identically(launched: Any) -> None:

    main, tmp = launched
    saved = [os.path.relpath(os.path.join(r, f), tmp) for r, _, fs in os.walk(tmp / "ckpt") for f in fs]
    # The engine checkpoint holds each process's optimizer shard.
    assert any("zero_pp_rank_1" in name for name in saved), saved
    resumed = run_distributed_preloaded(_resume_per_rank, 2, str(tmp), env=ENV)[0]
    full = main["full"]
    assert _close(resumed["losses"], full["losses"][5:], 1e-6), (resumed["losses"], full["losses"][5:])
    for key, value in full["weights"].items():
        assert (resumed["weights"][key] - value).abs().max() <= 1e-6, key
    assert resumed["lr"] == full["lr"]


def test_bf16_under_deepspeed_trains_in_bf16_and_matches_fp32_closely(launched: Any) -> None:
    observed, _ = launched
    run, fp32 = observed["z2_bf16"], observed["z2_gas1"]
    assert run["param_dtype"] == "torch.bfloat16" and run["out_dtype"] == "torch.float32"
    assert run["scaler"] is None  # the engine, not a GradScaler, owns loss scaling
    assert _close(run["losses"], fp32["losses"], tol=5e-2)
