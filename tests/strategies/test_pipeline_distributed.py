"""Pipeline parallelism in two real gloo processes (one stage each).

One launch trains through the Accelerator (GPipe and 1F1B, gradient accumulation, clipping,
"auto" split points) next to a single-process reference in the same process, and runs
``prepare_pippy`` inference (list and "auto" split points, gather_output on and off); the parent
compares.
"""

from __future__ import annotations

import torch
from parallel_support import Stack

from suite_support import reset_accelerator_state, run_distributed_preloaded

STEPS = 3


def _fresh(**kwargs):
    from accelerando import Accelerator

    reset_accelerator_state(partial=False)
    return Accelerator(**kwargs)


def _data(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(3)
    return [(torch.randn(8, 16, generator=g), torch.randint(0, 5, (8,), generator=g)) for _ in range(n)]


def _reference(accumulation: int, clip: float | None) -> tuple[list[float], dict]:
    torch.manual_seed(0)
    model = Stack()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for i, (x, y) in enumerate(_data(STEPS * accumulation)):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        (loss / accumulation).backward()
        losses.append(loss.item())
        if (i + 1) % accumulation == 0:
            if clip is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            opt.step()
            opt.zero_grad()
    return losses, {k: v.clone() for k, v in model.state_dict().items()}


def _pipeline_run(schedule: str, microbatches: int, accumulation: int, clip: float | None, split) -> dict:
    from accelerando.plugins.pipeline import PipelineParallelPlugin

    plugin = PipelineParallelPlugin(
        split_points=split,
        schedule=schedule,
        num_microbatches=microbatches,
        loss_fn=torch.nn.functional.cross_entropy,
    )
    acc = _fresh(kwargs_handlers=[plugin], gradient_accumulation_steps=accumulation)
    torch.manual_seed(0)
    model = Stack()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, opt = acc.prepare(model, opt)
    # Every stage must read the same batches: a prepared loader is not sharded over the pipeline.
    loader = acc.prepare(
        torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.arange(8.0)), batch_size=2)
    )
    batches = [batch[0].tolist() for batch in loader]
    losses = []
    for x, y in _data(STEPS * accumulation):
        with acc.accumulate(model):
            out = model(x, target=y)
            acc.backward(out.loss)
            losses.append(out.loss.item())
            if clip is not None and acc.sync_gradients:
                acc.clip_grad_norm_(model.parameters(), clip)
            opt.step()
            opt.zero_grad()
    state = acc.get_state_dict(model)
    ref_losses, ref_state = _reference(accumulation, clip)
    model.eval()
    x = _data(1)[0][0]
    evaluated = model(x).output
    with torch.no_grad():
        plain = Stack()
        plain.load_state_dict(ref_state)
        expected = plain(x)
    return {
        "strategy": type(acc._strategy).__name__,
        "distributed_type": str(acc.distributed_type),
        "split": model.split_points,
        "batches": batches,
        "loss_diff": max(abs(a - b) for a, b in zip(losses, ref_losses, strict=True)),
        "weight_diff": max((state[k] - ref_state[k]).abs().max().item() for k in ref_state),
        "eval_diff": (evaluated - expected).abs().max().item(),
    }


def _errors() -> dict:
    from accelerando.plugins.pipeline import PipelineParallelPlugin

    acc = _fresh(
        kwargs_handlers=[
            PipelineParallelPlugin(split_points=["layers.2"], loss_fn=torch.nn.functional.mse_loss)
        ]
    )
    model = acc.prepare(Stack())
    found = {}
    x = torch.randn(3, 16)
    try:
        model(x, target=torch.randn(3, 5))
    except ValueError as exc:
        found["indivisible"] = str(exc)
    try:
        acc.backward(Stack()(x).sum())
    except RuntimeError as exc:
        found["graph_loss"] = str(exc)
    try:
        _fresh(kwargs_handlers=[PipelineParallelPlugin(split_points=["nope"])]).prepare(Stack())
    except ValueError as exc:
        found["unknown_split"] = str(exc)
    return found


def _pippy() -> dict:
    from accelerando.inference import prepare_pippy

    results = {}
    torch.manual_seed(0)
    stack = Stack().eval()
    x = torch.randn(4, 16)
    expected = stack(x).detach()
    ready = prepare_pippy(stack, split_points=["layers.2"], example_args=(x,), gather_output=True)
    results["stack_diff"] = (ready(x) - expected).abs().max().item()
    torch.manual_seed(1)
    auto = Stack().eval()
    x = torch.randn(8, 16)
    expected = auto(x).detach()
    ready = prepare_pippy(auto, example_kwargs={"x": x}, num_chunks=4)
    out = ready(x=x)
    results["auto_split"] = ready.hf_split_points
    results["auto_diff"] = None if out is None else (out - expected).abs().max().item()
    results["gpt2_diff"] = _pippy_gpt2()
    return results


def _pippy_gpt2() -> float | None:
    from transformers import GPT2Config, GPT2LMHeadModel

    from accelerando.inference import prepare_pippy

    torch.manual_seed(0)
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=16, n_head=2, vocab_size=50, n_positions=16)).eval()
    ids = torch.randint(0, 50, (4, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = gpt2(ids, use_cache=False).logits
    ready = prepare_pippy(gpt2, example_args=(ids,), gather_output=True)
    out = ready(ids)
    got = out[0] if isinstance(out, (tuple, list)) else getattr(out, "logits", out)
    return (got - logits).abs().max().item()


def _worker() -> dict:
    result = {
        "gpipe": _pipeline_run("GPipe", 2, 1, None, ["layers.2"]),
        "1f1b_accum_clip": _pipeline_run("1F1B", 4, 2, 0.5, "auto"),
        "errors": _errors(),
        "pippy": _pippy(),
    }
    return result


def test_pipeline_training_equals_single_process_and_prepare_pippy():
    ranks = run_distributed_preloaded(_worker, 2, timeout=600)
    for rank, result in enumerate(ranks):
        for key in ("gpipe", "1f1b_accum_clip"):
            run = result[key]
            assert run["strategy"] == "PipelineStrategy", run
            assert run["distributed_type"].endswith("MULTI_CPU"), run
            assert run["loss_diff"] < 1e-5, (rank, key, run)
            assert run["weight_diff"] < 1e-5, (rank, key, run)
            assert run["eval_diff"] < 1e-5, (rank, key, run)
            assert run["batches"] == [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0], [6.0, 7.0]], (rank, key, run)
        assert ranks[0]["1f1b_accum_clip"]["split"] == ["layers.2.0"]  # "auto": equal parameter halves
        errors = result["errors"]
        assert "not divisible by num_microbatches=2" in errors["indivisible"]
        assert "accelerator.backward(out.loss)" in errors["graph_loss"]
        assert "'nope' is not a submodule" in errors["unknown_split"]
        assert result["pippy"]["stack_diff"] < 1e-6
    assert ranks[0]["pippy"]["auto_diff"] is None  # only the last stage gets the output
    assert ranks[1]["pippy"]["auto_diff"] < 1e-6
    assert ranks[1]["pippy"]["auto_split"] == ["layers.2.0"]
    assert ranks[0]["pippy"]["gpt2_diff"] < 1e-5  # a tiny transformers GPT-2, gathered on every process
    assert ranks[1]["pippy"]["gpt2_diff"] < 1e-5
