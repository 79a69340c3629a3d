"""The simulator: fake tensors on a fake process group, checked against closed forms and real runs.

The fast tests use a small model of our own; the slow ones (``-m slow``, commands in docs/benchmarks.md)
run the validation against real gloo processes, the extrapolation from 2 and 4 layers against a
full-depth simulation, and the per-rank scaling of FSDP2 / ZeRO-3 at world sizes 8 to 4096.
"""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
from planning_toy import ToyLM, toy_source

from accelerando.backends.planning.models import resolve_model
from accelerando.backends.planning.planner import _scale
from accelerando.backends.planning.simulate import simulate
from accelerando.backends.planning.spec import Candidate, TrainingShape
from accelerando.backends.planning.validation import (
    TOLERANCE,
    VALIDATION_MODELS,
    VALIDATION_SHAPE,
    compare,
    measure_on_rank,
)
from accelerando.test_utils.distributed import run_distributed

SHAPE = TrainingShape(micro_batch=2, seq_length=16, mixed_precision="no")


def _padded_bytes(world: int) -> int:
    """Bytes of every parameter padded along dim 0 to a multiple of ``world`` (FSDP2's sharding)."""
    total = 0
    for param in ToyLM().parameters():
        rest = param.numel() // param.shape[0]
        total += world * math.ceil(param.shape[0] / world) * rest * param.element_size()
    return total


def test_ddp_is_the_plain_step_plus_its_buckets_and_their_all_reduce() -> None:
    count = simulate(toy_source(), Candidate("ddp", dp_replicate=2), SHAPE)
    assert count.trainable_bytes == _padded_bytes(1)
    assert count.collective_bytes == {"all_reduce (dp)": _padded_bytes(1)}  # the toy has no buffers
    assert count.memory.gradients >= count.trainable_bytes  # the buckets at least
    assert count.memory.optimizer >= 2 * count.trainable_bytes  # AdamW's two states
    assert count.num_parameters == sum(p.numel() for p in ToyLM().parameters())


@pytest.mark.slow
def test_fsdp2_shards_state_and_gathers_every_layer_twice() -> None:
    count = simulate(toy_source(), Candidate("fsdp2", dp_shard=2, zero_stage=3), SHAPE)
    assert count.trainable_bytes == _padded_bytes(2) // 2
    assert count.collective_bytes == {
        "all_gather (dp)": 2 * _padded_bytes(2),
        "reduce_scatter (dp)": _padded_bytes(2),
    }
    plain = simulate(toy_source(), Candidate("ddp", dp_replicate=2), SHAPE)
    assert count.memory.peak < plain.memory.peak


def test_a_process_group_already_running_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.distributed as dist

    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    with pytest.raises(ValueError, match="separate process"):
        simulate(toy_source(), Candidate("ddp"), SHAPE)


def test_importing_accelerando_or_listing_commands_does_not_load_the_planner() -> None:
    code = (
        "import sys, accelerando\n"
        "from accelerando.commands.cli import main\n"
        "main(['--help'])\n"
        "assert 'accelerando.backends.planning' not in sys.modules, 'planner loaded'\n"
        "assert 'transformers' not in sys.modules\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "plan" in done.stdout and "Simulate a training step" in done.stdout


@pytest.mark.slow
@pytest.mark.parametrize("world", [8, 64, 512, 4096])
def test_fsdp2_per_rank_state_follows_the_zero3_closed_form(world: int) -> None:
    """Per rank: parameters, gradients and optimizer state are the (dim-0 padded) whole over ``world``."""
    count = simulate(toy_source(), Candidate("fsdp2", dp_shard=world, zero_stage=3), SHAPE)
    padded = _padded_bytes(world)
    assert count.trainable_bytes == padded // world
    assert count.collective_bytes["all_gather (dp)"] == 2 * padded
    assert count.collective_bytes["reduce_scatter (dp)"] == padded
    assert count.memory.optimizer >= 2 * padded // world  # AdamW: 2 fp32 states per sharded element


@pytest.mark.slow
def test_extrapolating_from_2_and_4_layers_matches_a_full_depth_simulation() -> None:
    source = resolve_model("tiny-llama").with_layers(8)
    shape = VALIDATION_SHAPE
    for candidate in (Candidate("ddp", dp_replicate=2), Candidate("fsdp2", dp_shard=2, zero_stage=3)):
        full = simulate(source, candidate, shape)
        line = _scale(
            simulate(source.with_layers(2), candidate, shape),
            simulate(source.with_layers(4), candidate, shape),
            2,
            4,
            8,
        )
        assert abs(line.memory.peak / full.memory.peak - 1) < 0.01, candidate.name
        assert line.collective_bytes == full.collective_bytes
        assert line.num_parameters == full.num_parameters


@pytest.mark.slow
@pytest.mark.parametrize("world", [1, 2, 4])
@pytest.mark.parametrize("model", VALIDATION_MODELS)
def test_predicted_peak_and_collectives_match_a_real_gloo_run(model: str, world: int) -> None:
    """Rank 0 of a real run (gloo, ``world`` CPU processes) against the simulation: peak within 10 %."""
    measured = run_distributed(measure_on_rank, world, [model], world, VALIDATION_SHAPE, timeout=1800)[0]
    rows = compare(world, measured)
    assert rows
    for row in rows:
        if row.predicted is None:
            assert "tensor-parallel plan" in row.note, row.note  # only a model without a tp_plan may skip
            continue
        assert row.peak_error is not None and abs(row.peak_error) <= TOLERANCE, (row.layout, row.peak_error)
        assert row.collectives_equal, (
            row.layout,
            row.predicted.collective_bytes,
            row.measured.collective_bytes,
        )
