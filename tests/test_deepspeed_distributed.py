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

from accelerando.utils.imports import is_deepspeed_available

pytestmark = pytest.mark.skipif(not is_deepspeed_available(), reason="needs deepspeed (pip install deepspeed)")

ENV = {"OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu"}
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


def _reference(gas: int, world: int, opt_name: str = "sgd") -> tuple[list[float], list[float], dict[str, Any]]:
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


def _fresh_accelerator(**kwargs: Any) -> Any:
    from accelerando import Accelerator
    from accelerando.state import AcceleratorState, GradientState

    AcceleratorState._reset_state()
    GradientState._reset_state() if hasattr(GradientState, "_reset_state") else None
    return Accelerator(**kwargs)


def _train(acc: Any, model: Any, opt: Any, gas: int, steps: int, start: int = 0) -> tuple[list[float], list[float]]:
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
    acc = _fresh_accelerator(deepspeed_plugin=plugin, gradient_accumulation_steps=gas)
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    model, opt, _ = acc.prepare(model, opt, _loader())
    losses, norms = _train(acc, model, opt, gas, STEPS)
    weights = acc.get_state_dict(model)
    return {"losses": losses, "norms": norms, "weights": weights, "type": str(acc.distributed_type)}


def _stages_per_rank() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for stage in (1, 2, 3):
        for gas in (1, 4):
            out[f"z{stage}_gas{gas}"] = _stage_run(stage, gas)
    out["z2_offload"] = _stage_run(2, 1, {"offload_optimizer_device": "cpu"})
    out["z3_offload"] = _stage_run(3, 1, {"offload_optimizer_device": "cpu"})
    return out


def _close(a: Any, b: Any, tol: float = 1e-4) -> bool:
    return all(abs(x - y) <= tol * max(1.0, abs(y)) for x, y in zip(a, b, strict=True))


def test_zero_stages_match_plain_training_with_and_without_accumulation() -> None:
    from accelerando.test_utils import run_distributed

    results = run_distributed(_stages_per_rank, 2, env=ENV)
    main = results[0]
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
    ref_losses, _, _ = _reference(1, 2)
    for name in ("z2_offload", "z3_offload"):
        assert _close(main[name]["losses"], ref_losses), name
