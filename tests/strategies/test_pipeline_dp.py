"""Pipeline x data parallelism: the layout checks (no processes) and 4 real gloo processes (pp=2 x dp=2).

The 4-process launches train a stack of Linear blocks through the Accelerator and compare, in each
process, with a single-process full-batch run of the same model and data: launch one trains 10
optimizer steps with gradient accumulation 2 and clipping, saves a checkpoint at step 4 and the
final model (``save_model``), and evaluates with ``gather_for_metrics``; launch two starts fresh
processes (asking for the 2 pipelines with ``ParallelismConfig(dp_replicate_size=2)`` this time),
loads the step-4 checkpoint and continues to step 10.
"""

from __future__ import annotations

import os

import pytest
import torch
from parallel_support import Stack

from accelerando.backends.strategies.pipeline.data_parallel import pipeline_data_parallel_sizes
from suite_support import reset_accelerator_state

STEPS = 10  # optimizer steps
ACCUM = 2
BATCH = 4  # per pipeline (each of the 2 replicas)
SAVE_AT = 4  # optimizer steps before the checkpoint
CLIP = 0.5
EVAL_SAMPLES = 10


# ------------------------------------------------------------------------------- layout checks
class _Config:
    """A stand-in ParallelismConfig (only the sizes are read)."""

    def __init__(self, **sizes: int) -> None:
        for axis in ("dp_replicate", "dp_shard", "tp", "cp", "sp"):
            setattr(self, f"{axis}_size", sizes.get(axis, 1))


def test_layout_sizes():
    assert pipeline_data_parallel_sizes(None, 4) == (4, 1)
    assert pipeline_data_parallel_sizes(2, 4) == (2, 2)
    assert pipeline_data_parallel_sizes(2, 8) == (2, 4)
    assert pipeline_data_parallel_sizes(4, 8, _Config(dp_replicate=2)) == (4, 2)
    assert pipeline_data_parallel_sizes(2, 4, _Config()) == (2, 2)
    assert pipeline_data_parallel_sizes(None, 4, _Config(dp_replicate=2)) == (2, 2)  # the rest are stages
    assert pipeline_data_parallel_sizes(None, 6, _Config(dp_replicate=3)) == (2, 3)


def test_layout_refusals_name_the_numbers_and_the_fix():
    with pytest.raises(
        ValueError, match=r"pp_size=3\) with 4 processes.*3 does not divide 4.*\{2, 4\}.*e\.g\. 6"
    ):
        pipeline_data_parallel_sizes(3, 4)
    with pytest.raises(ValueError, match=r"pp_size=8\) with 4 processes.*e\.g\. 8"):
        pipeline_data_parallel_sizes(8, 4)
    with pytest.raises(
        ValueError,
        match=r"dp_replicate_size=4\) needs 2 x 4 = 8 processes but the job has 4.*dp_replicate_size=2",
    ):
        pipeline_data_parallel_sizes(2, 4, _Config(dp_replicate=4))
    with pytest.raises(ValueError, match=r"ParallelismConfig\(tp_size=2\).*drop those"):
        pipeline_data_parallel_sizes(2, 8, _Config(tp=2))
    with pytest.raises(ValueError, match=r"tp_size='auto'.*give numbers"):
        pipeline_data_parallel_sizes(2, 4, _Config(tp="auto"))
    with pytest.raises(RuntimeError, match="at least 2 processes"):
        pipeline_data_parallel_sizes(None, 1)


# ---------------------------------------------------------------------------- 4 processes


def _dataset(n: int, seed: int) -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(seed)
    return torch.utils.data.TensorDataset(
        torch.randn(n, 16, generator=g), torch.randint(0, 5, (n,), generator=g)
    )


def _train_set() -> torch.utils.data.TensorDataset:
    return _dataset(STEPS * ACCUM * 2 * BATCH, 3)


def _reference() -> dict:
    """One process, full batches (both replicas' batches at once): losses, norms, states at SAVE_AT and the end."""
    torch.manual_seed(0)
    model = Stack()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses, norms, saved = [], [], None
    loader = torch.utils.data.DataLoader(_train_set(), batch_size=2 * BATCH)
    for i, (x, y) in enumerate(loader):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        (loss / ACCUM).backward()
        losses.append(loss.item())
        if (i + 1) % ACCUM == 0:
            norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP).item())
            opt.step()
            opt.zero_grad()
            if (i + 1) // ACCUM == SAVE_AT:
                saved = {k: v.clone() for k, v in model.state_dict().items()}
    eval_set = _dataset(EVAL_SAMPLES, 5)
    with torch.no_grad():
        preds = model(eval_set.tensors[0])
    return {
        "losses": losses,
        "norms": norms,
        "saved": saved,
        "final": {k: v.clone() for k, v in model.state_dict().items()},
        "preds": preds,
    }


def _accelerator(replicas_from_config: bool):
    """pp=2 x dp=2 from ``PipelineParallelPlugin(pp_size=2)``, or from ``ParallelismConfig(dp_replicate_size=2)``."""
    from accelerando import Accelerator, ParallelismConfig
    from accelerando.plugins.pipeline import PipelineParallelPlugin

    reset_accelerator_state(partial=False)
    plugin = PipelineParallelPlugin(
        split_points=["layers.2"],
        schedule="1F1B",
        num_microbatches=2,
        pp_size=None if replicas_from_config else 2,
        loss_fn=torch.nn.functional.cross_entropy,
    )
    config = ParallelismConfig(dp_replicate_size=2) if replicas_from_config else None
    return Accelerator(kwargs_handlers=[plugin], parallelism_config=config, gradient_accumulation_steps=ACCUM)


def _setup(replicas_from_config: bool = False):
    acc = _accelerator(replicas_from_config)
    torch.manual_seed(0)
    model = Stack()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    loader = torch.utils.data.DataLoader(_train_set(), batch_size=BATCH)
    # A constant factor: it only counts its steps (the data-parallel rule: dp steps per optimizer step).
    scheduler = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0)
    model, opt, loader, scheduler = acc.prepare(model, opt, loader, scheduler)
    acc.scheduler_under_test = scheduler
    return acc, model, opt, loader


def _train(
    acc, model, opt, loader, first_step: int, stop_after: int | None, on_step=None
) -> tuple[list, list]:
    """Train from optimizer step ``first_step``; the losses are the mean over the pipelines."""
    losses, norms = [], []
    model.train()
    for i, (x, y) in enumerate(loader):
        with acc.accumulate(model):
            out = model(x, target=y)
            acc.backward(out.loss)
            losses.append(acc.reduce(out.loss.detach().clone(), "mean").item())
            if acc.sync_gradients:
                norms.append(acc.clip_grad_norm_(model.parameters(), CLIP).item())
            opt.step()
            acc.scheduler_under_test.step()
            opt.zero_grad()
        step = first_step + (i + 1) // ACCUM
        if (i + 1) % ACCUM == 0 and on_step is not None:
            on_step(step)
        if stop_after is not None and step == stop_after and (i + 1) % ACCUM == 0:
            break
    return losses, norms


def _max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys(), (sorted(a), sorted(b))
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def _first_launch(workdir: str) -> dict:
    acc, model, opt, loader = _setup()
    ref = _reference()
    layout = acc._strategy.layout
    batches = [(x.shape[0], float(x[0, 0])) for x, _ in loader][:2]
    checkpoint = os.path.join(workdir, "ckpt")

    def on_step(step: int) -> None:
        if step == SAVE_AT:
            acc.save_state(checkpoint)

    losses, norms = _train(acc, model, opt, loader, 0, None, on_step)
    state = acc.get_state_dict(model)
    acc.save_model(model, os.path.join(workdir, "model"))
    # Evaluation: each pipeline reads its own shard; gather_for_metrics returns every sample once.
    model.eval()
    eval_loader = acc.prepare(torch.utils.data.DataLoader(_dataset(EVAL_SAMPLES, 5), batch_size=2))
    plain = Stack()
    plain.load_state_dict(ref["final"])
    preds, labels, local_eval_diff = [], [], 0.0
    for x, y in eval_loader:
        output = model(x).output  # every stage of the pipeline receives the last stage's output
        with torch.no_grad():
            local_eval_diff = max(local_eval_diff, (output - plain(x)).abs().max().item())
        preds.append(acc.gather_for_metrics(output))
        labels.append(acc.gather_for_metrics(y))
    acc.wait_for_everyone()
    eval_set = _dataset(EVAL_SAMPLES, 5)
    preds_t, labels_t = torch.cat(preds), torch.cat(labels)
    shapes_match = preds_t.shape == ref["preds"].shape and labels_t.shape == eval_set.tensors[1].shape
    loaded = {}
    if acc.is_main_process:
        from safetensors.torch import load_file

        loaded = load_file(os.path.join(workdir, "model", "model.safetensors"))
    return {
        "layout": (layout.stage_index, layout.dp_rank, layout.dp_size, layout.ranks),
        "batches": batches,
        "loss_diff": max(abs(a - b) for a, b in zip(losses, ref["losses"], strict=True)),
        "norm_diff": max(abs(a - b) for a, b in zip(norms, ref["norms"], strict=True)),
        "weight_diff": _max_diff(state, ref["final"]),
        "saved_model_diff": _max_diff(loaded, ref["final"]) if loaded else None,
        "local_eval_diff": local_eval_diff,
        "eval_shapes": (tuple(preds_t.shape), tuple(labels_t.shape)),
        "eval_pred_diff": (preds_t - ref["preds"]).abs().max().item() if shapes_match else None,
        "eval_labels_equal": bool(shapes_match and torch.equal(labels_t, eval_set.tensors[1])),
        "checkpoint_files": sorted(os.listdir(checkpoint)),
        "scheduler_steps": acc.scheduler_under_test.scheduler.last_epoch,
        "optimizer_states": len(
            torch.load(os.path.join(checkpoint, "optimizer.bin"), weights_only=True)["state"]
        ),
        "param_names": [name for name, _ in Stack().named_parameters()],
        "ranks": (acc.data_parallel_rank, acc.pipeline_parallel_rank, acc.torch_device_mesh is not None),
    }


def _second_launch(workdir: str) -> dict:
    acc, model, opt, loader = _setup(replicas_from_config=True)
    ref = _reference()
    acc.load_state(os.path.join(workdir, "ckpt"))
    restored = {k: v.clone() for k, v in acc.get_state_dict(model).items()}  # the live tensors otherwise
    resumed = acc.skip_first_batches(loader, SAVE_AT * ACCUM)
    losses, norms = _train(acc, model, opt, resumed, SAVE_AT, None)
    state = acc.get_state_dict(model)
    layout = acc._strategy.layout
    return {
        "layout": (layout.stage_index, layout.dp_rank, layout.dp_size, layout.ranks),
        "restored_diff": _max_diff(restored, ref["saved"]),
        "loss_diff": max(abs(a - b) for a, b in zip(losses, ref["losses"][SAVE_AT * ACCUM :], strict=True)),
        "norm_diff": max(abs(a - b) for a, b in zip(norms, ref["norms"][SAVE_AT:], strict=True)),
        "weight_diff": _max_diff(state, ref["final"]),
    }


@pytest.fixture(scope="module")
def launches(tmp_path_factory) -> tuple[list[dict], list[dict]]:
    from accelerando.test_utils import run_distributed

    workdir = str(tmp_path_factory.mktemp("ppdp"))
    first = run_distributed(_first_launch, 4, workdir, timeout=900)
    second = run_distributed(_second_launch, 4, workdir, timeout=900)
    return first, second


@pytest.mark.slow
def test_pp2_dp2_training_equals_single_process(launches):
    first, _ = launches
    assert [r["layout"] for r in first] == [
        (0, 0, 2, (0, 1)),
        (1, 0, 2, (0, 1)),
        (0, 1, 2, (2, 3)),
        (1, 1, 2, (2, 3)),
    ]
    # Both stages of a pipeline read the same batches; the two pipelines read different ones.
    assert first[0]["batches"] == first[1]["batches"]
    assert first[2]["batches"] == first[3]["batches"]
    assert first[0]["batches"] != first[2]["batches"]
    for rank, result in enumerate(first):
        assert result["loss_diff"] < 1e-5, (rank, result)
        assert result["norm_diff"] < 1e-5, (rank, result)
        assert result["weight_diff"] < 1e-5, (rank, result)
        assert result["local_eval_diff"] < 1e-5, (rank, result)
    assert first[0]["saved_model_diff"] < 1e-5
    # One optimizer file with every stage's state, as an unsplit run writes it.
    files = first[0]["checkpoint_files"]
    assert "optimizer.bin" in files and not any("stage" in name for name in files), files
    assert first[0]["optimizer_states"] == len(first[0]["param_names"]), first[0]


@pytest.mark.slow
def test_pp2_dp2_resume_equals_uninterrupted(launches):
    first, second = launches
    # The second launch asks for the 2 replicas with ParallelismConfig(dp_replicate_size=2) instead of pp_size.
    assert [r["layout"] for r in second] == [r["layout"] for r in first]
    for rank, result in enumerate(second):
        assert result["restored_diff"] < 1e-6, (rank, result)
        assert result["loss_diff"] < 1e-5, (rank, result)
        assert result["norm_diff"] < 1e-5, (rank, result)
        assert result["weight_diff"] < 1e-5, (rank, result)


@pytest.mark.slow
def test_pp2_dp2_gather_for_metrics_and_scheduler_count_data_parallel_ranks_only(launches):
    first, _ = launches
    for rank, result in enumerate(first):
        assert result["eval_shapes"] == ((EVAL_SAMPLES, 5), (EVAL_SAMPLES,)), (rank, result)
        assert result["eval_labels_equal"], (rank, result)
        assert result["eval_pred_diff"] < 1e-5, (rank, result)
        assert result["scheduler_steps"] == STEPS * 2, (rank, result)  # 2 data-parallel pipelines
        # "pp" is the inner axis: processes 0,1 are pipeline 0's stages, 2,3 pipeline 1's.
        assert result["ranks"] == (rank // 2, rank % 2, True), (rank, result)
