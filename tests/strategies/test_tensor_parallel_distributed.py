"""Tensor parallelism (DTensor) on real gloo processes: equal to one process, resume, save_model.

Each rank trains a tiny transformers Llama through the Accelerator and, beside it, the same model
plainly on the whole batch (the single-process run), so every comparison is made in the worker and
the parent only checks the numbers. Each launch makes many checks: launches cost seconds.
"""

from __future__ import annotations

import os

import pytest
import torch
from parallel_support import VOCAB
from parallel_support import fresh_accelerator as _fresh
from parallel_support import sgd_optimizer as _optimizer
from parallel_support import tiny_llama as _llama

from accelerando.test_utils import run_distributed

pytest.importorskip("transformers")

STEPS = 10  # optimizer steps
ACCUM = 2  # micro-batches per optimizer step
RESUME_AT = 4  # optimizer steps before save_state


def _dataset(n: int, seq: int = 8) -> torch.Tensor:
    return torch.randint(0, VOCAB, (n, seq), generator=torch.Generator().manual_seed(1))


def _reference(data: torch.Tensor, global_batch: int, steps: int) -> tuple[list[float], list[float], dict]:
    """The single-process run: the whole global batch per micro-batch, loss / ACCUM, clipping."""
    model = _llama()
    opt = _optimizer(model)
    losses, norms = [], []
    for step in range(steps):
        for micro in range(ACCUM):
            start = (step * ACCUM + micro) * global_batch
            ids = data[start : start + global_batch]
            loss = model(input_ids=ids, labels=ids).loss
            (loss / ACCUM).backward()
            losses.append(loss.item())
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)))
        opt.step()
        opt.zero_grad()
    return losses, norms, {k: v.detach().clone() for k, v in model.state_dict().items()}


def _train(acc, model, opt, loader, first_step: int, steps: int) -> tuple[list[float], list[float]]:
    losses, norms = [], []
    batches = iter(loader)
    for _ in range(steps * ACCUM):
        ids = next(batches)
        with acc.accumulate(model):
            loss = model(input_ids=ids, labels=ids).loss
            acc.backward(loss)
            if acc.sync_gradients:
                norms.append(float(acc.clip_grad_norm_(model.parameters(), 1.0)))
            opt.step()
            opt.zero_grad()
        losses.append(float(acc.reduce(loss.detach(), "mean")))
    return losses, norms


def _max_diff(a: dict, b: dict) -> float:
    assert set(a) == set(b), set(a) ^ set(b)
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


def _tp_worker(root: str, sizes: dict, phase: int) -> dict:
    """Phase 0: train STEPS steps (save_state after RESUME_AT), compare; phase 1: resume and finish."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor
    from torch.utils.data import DataLoader

    from accelerando import ParallelismConfig

    dp = sizes.get("dp_shard_size", 1) * sizes.get("dp_replicate_size", 1)
    acc = _fresh(parallelism_config=ParallelismConfig(**sizes), gradient_accumulation_steps=ACCUM)
    per_rank = 2
    data = _dataset(STEPS * ACCUM * per_rank * dp)
    loader = DataLoader(data, batch_size=per_rank, shuffle=False)
    model = _llama(seed=dist.get_rank())  # different on each rank: prepare must use rank 0's weights
    opt = _optimizer(model)
    model, opt, loader = acc.prepare(model, opt, loader)
    out: dict = {
        "strategy": acc._strategy.name,
        "distributed_type": str(acc.distributed_type),
        "applied": list(acc._strategy.applied),
        "dtensor_params": sum(isinstance(p, DTensor) for p in model.parameters()),
        "tp_rank": acc.tensor_parallel_rank,
        "dp_rank": acc.data_parallel_rank,
    }
    # Every tensor-parallel rank of one data-parallel group reads the same batch.
    first = next(iter(loader))
    everyone = [torch.empty_like(first) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, first)
    out["batches"] = [t.tolist() for t in everyone]
    ckpt = os.path.join(root, "ckpt")
    if phase == 0:
        ref_losses, ref_norms, ref_state = _reference(data, per_rank * dp, STEPS)
        losses, norms = _train(acc, model, opt, loader, 0, RESUME_AT)
        acc.save_state(ckpt)
        tail, tail_norms = _train(
            acc, model, opt, acc.skip_first_batches(loader, RESUME_AT * ACCUM), RESUME_AT, STEPS - RESUME_AT
        )
        losses += tail
        norms += tail_norms
        full = acc.get_state_dict(model)
        out["loss_diff"] = max(abs(a - b) for a, b in zip(losses, ref_losses, strict=True))
        # relative: the norms are sums over every gradient element, taken in another order
        out["norm_diff"] = max(abs(a - b) / max(1.0, abs(b)) for a, b in zip(norms, ref_norms, strict=True))
        out["tail"] = tail
        if acc.is_main_process:
            out["weight_diff"] = _max_diff(full, ref_state)
            out["state"] = {k: v.clone() for k, v in full.items()}
        # save_model writes whole weights that a plain model loads and runs identically.
        saved = os.path.join(root, "saved")
        acc.save_model(model, saved)
        probe = data[:3]
        with torch.no_grad():
            logits = model(input_ids=probe).logits
        if acc.is_main_process:
            from safetensors.torch import load_file

            plain = _llama()
            weights = load_file(os.path.join(saved, "model.safetensors"))
            out["missing"] = plain.load_state_dict(weights, strict=True)
            out["saved_equal"] = all(torch.equal(weights[k], full[k]) for k in full)
            with torch.no_grad():
                out["output_diff"] = float((plain(input_ids=probe).logits - logits).abs().max())
        # gather_for_metrics counts each sample once, not once per tensor-parallel rank.
        eval_loader = acc.prepare(DataLoader(data[:5], batch_size=2))
        seen = torch.cat([acc.gather_for_metrics(b) for b in eval_loader])
        out["eval_equal"] = torch.equal(seen, data[:5])
    else:
        acc.load_state(ckpt)
        tail, _ = _train(
            acc, model, opt, acc.skip_first_batches(loader, RESUME_AT * ACCUM), RESUME_AT, STEPS - RESUME_AT
        )
        out["tail"] = tail
        full = acc.get_state_dict(model)
        if acc.is_main_process:
            out["state"] = {k: v.clone() for k, v in full.items()}
    return out


def _check(first: list[dict], second: list[dict], world: int, tol: float = 1e-5) -> None:
    main = first[0]
    assert main["strategy"] == "composable", main
    assert main["applied"][0].startswith("1. tensor parallel"), main["applied"]
    assert main["dtensor_params"] > 0
    numbers = {k: main[k] for k in ("loss_diff", "norm_diff", "weight_diff")}
    assert all(v < tol for v in numbers.values()), numbers
    for rank in range(world):
        assert second[rank]["tail"] == pytest.approx(first[rank]["tail"], abs=1e-6), rank
    assert main["missing"].missing_keys == [] and main["missing"].unexpected_keys == []
    assert main["saved_equal"] and main["output_diff"] < tol, main
    assert main["eval_equal"]
    assert _max_diff(second[0]["state"], main["state"]) < 1e-6  # resumed weights = uninterrupted ones


@pytest.mark.slow  # two 2-process launches (~1 min on 2 cores): python -m pytest -m slow tests/strategies
def test_tp2_trains_like_one_process_resumes_and_saves(tmp_path):
    sizes = {"tp_size": 2}
    first = run_distributed(_tp_worker, 2, str(tmp_path), sizes, 0, timeout=600)
    second = run_distributed(_tp_worker, 2, str(tmp_path), sizes, 1, timeout=600)
    _check(first, second, 2)
    main = first[0]
    # tp_size=2 on 2 processes is tensor parallelism, not DDP: the two ranks read the same batch.
    assert main["distributed_type"] == "MULTI_CPU"
    assert main["batches"][0] == main["batches"][1]
    assert [r["tp_rank"] for r in first] == [0, 1] and [r["dp_rank"] for r in first] == [0, 0]


@pytest.mark.slow
def test_fsdp2_x_tp_2x2_trains_like_one_process(tmp_path):
    sizes = {"dp_shard_size": 2, "tp_size": 2}
    first = run_distributed(_tp_worker, 4, str(tmp_path), sizes, 0, timeout=900)
    second = run_distributed(_tp_worker, 4, str(tmp_path), sizes, 1, timeout=900)
    _check(first, second, 4)
    main = first[0]
    assert main["distributed_type"] == "FSDP"
    assert main["applied"][1].startswith("2. FSDP2"), main["applied"]
    batches = main["batches"]  # ranks (dp, tp): (0,0) (0,1) (1,0) (1,1)
    assert batches[0] == batches[1] and batches[2] == batches[3] and batches[0] != batches[2]
