"""Check the simulator against real runs: predicted vs measured peak memory and collective bytes.

A measured run is :func:`~accelerando.backends.planning.simulate.run_steps` with real tensors on a real gloo
process group (``world_size`` CPU processes); the prediction is the same function on fake tensors and
the fake process group. Both count with the same trackers (:mod:`.tracking`), so "measured peak" is
the largest sum of live tensor storage bytes on rank 0 during two training steps, not an allocator
statistic (CPU has none). The benchmark ``benchmarks/bench_plan_validation.py`` prints the table; the
slow tests in ``tests/planning`` fail when a prediction drifts past :data:`TOLERANCE`.

DeepSpeed ZeRO-3 (row ``zero3``) is measured through ``Accelerator`` with a ``DeepSpeedPlugin(zero_stage=3)``
(``tests/planning/planning_deepspeed.py``: the facade sits above this package) and predicted by the
planner's formula from the ``fsdp2`` simulation (:func:`~accelerando.backends.planning.derive.zero3_from_fsdp2`),
which :func:`compare` applies to rows keyed ``<model>/zero3``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import torch.distributed as dist

from accelerando.backends.planning.derive import ZERO3_DEFAULTS, Zero3Settings, zero3_from_fsdp2
from accelerando.backends.planning.models import resolve_model
from accelerando.backends.planning.simulate import StepCount, run_steps, simulate, zero3_sizes
from accelerando.backends.planning.spec import Candidate, TrainingShape

__all__ = [
    "TOLERANCE",
    "VALIDATION_MODELS",
    "VALIDATION_SHAPE",
    "ZERO3_LAYOUT",
    "ZERO3_VARIANTS",
    "ValidationRow",
    "compare",
    "format_rows",
    "measure_on_rank",
    "predict",
    "validation_candidates",
]

#: Largest relative peak-memory error a prediction may have.
TOLERANCE = 0.10
#: The models validated (built-in tiny configs).
VALIDATION_MODELS: tuple[str, ...] = ("tiny-llama", "tiny-gpt2", "tiny-t5")
#: The row label of DeepSpeed ZeRO-3 (measured through ``Accelerator``, predicted by formula).
ZERO3_LAYOUT = "zero3"
#: DeepSpeed ZeRO-3 rows -> the ``zero_optimization`` keys set over DeepSpeed's defaults. ``zero3`` is the
#: plain ``DeepSpeedPlugin(zero_stage=3)``: its 5e8-element reduce bucket (2 GB in fp32, allocated whole)
#: dominates a tiny model's peak and its persistence threshold (1e5 elements) keeps every tiny parameter
#: whole on every rank. ``zero3_small_buckets`` sets what transformers' DeepSpeed integration fills in for
#: ``"auto"`` at hidden size 64 (reduce bucket h^2, prefetch 0.9 h^2, persistence 10 h): parameters are then
#: partitioned and gathered, and the rest of the formula carries the peak.
ZERO3_VARIANTS: dict[str, dict[str, int]] = {
    ZERO3_LAYOUT: {},
    "zero3_small_buckets": {
        "reduce_bucket_size": 4096,
        "stage3_prefetch_bucket_size": 3686,
        "stage3_param_persistence_threshold": 640,
    },
}
#: The training shape of the validation runs (fp32 on CPU).
VALIDATION_SHAPE = TrainingShape(micro_batch=2, seq_length=64, mixed_precision="no", optimizer="adamw")


def validation_candidates(world_size: int) -> list[Candidate]:
    """DDP, ZeRO-3 / FSDP2, and FSDP2 x TP (tp=2, from 2 processes) at ``world_size``."""
    found = [
        Candidate("ddp", dp_replicate=world_size),
        Candidate("fsdp2", dp_shard=world_size, zero_stage=3),
    ]
    if world_size >= 2 and world_size % 2 == 0:
        found.append(Candidate("fsdp2_tp2", tp=2, dp_shard=world_size // 2, zero_stage=3))
    return found


def measure_on_rank(models: list[str], world_size: int, shape: TrainingShape) -> dict[str, StepCount | str]:
    """Run on one rank of a real gloo job: measure every (model, candidate); ``key -> count or error``.

    Called once per process by ``run_distributed``; the environment holds the rendezvous address.
    """
    dist.init_process_group("gloo")
    results: dict[str, StepCount | str] = {}
    try:
        for name in models:
            source = resolve_model(name)
            for candidate in validation_candidates(world_size):
                try:
                    results[f"{name}/{candidate.name}"] = run_steps(source, candidate, shape, fake=False)
                except ValueError as err:
                    results[f"{name}/{candidate.name}"] = str(err)
    finally:
        dist.destroy_process_group()
    return results


@dataclass(frozen=True)
class ValidationRow:
    """One (model, layout, world size) comparison.

    Attributes:
        model: the model name.
        layout: the candidate name.
        world_size: processes.
        predicted: the simulated count (None when the layout does not apply, e.g. no tp_plan).
        measured: rank 0's measured count (None likewise).
        note: why a row has no numbers.
    """

    model: str
    layout: str
    world_size: int
    predicted: StepCount | None
    measured: StepCount | None
    note: str = ""

    @property
    def peak_error(self) -> float | None:
        """``predicted / measured - 1`` of the peak, or None without numbers."""
        if self.predicted is None or self.measured is None or not self.measured.memory.peak:
            return None
        return self.predicted.memory.peak / self.measured.memory.peak - 1

    @property
    def collectives_equal(self) -> bool | None:
        """True when the predicted bytes per collective kind equal the measured ones (None without numbers)."""
        if self.predicted is None or self.measured is None:
            return None
        return _nonzero(self.predicted.collective_bytes) == _nonzero(self.measured.collective_bytes)


def _nonzero(counts: dict[str, int]) -> dict[str, int]:
    return {k: v for k, v in counts.items() if v}


def _listed(counts: dict[str, int]) -> str:
    return ", ".join(f"{k}: {v}" for k, v in sorted(_nonzero(counts).items())) or "-"


@functools.lru_cache(maxsize=16)
def _fsdp2_count(name: str, world_size: int, shape: TrainingShape) -> StepCount:
    """The ``fsdp2`` simulation the DeepSpeed rows of one model and world size share (simulated once)."""
    return simulate(resolve_model(name), Candidate("fsdp2", dp_shard=world_size, zero_stage=3), shape)


def predict(name: str, layout: str, world_size: int, shape: TrainingShape = VALIDATION_SHAPE) -> StepCount:
    """The simulator's count for one validation row (a :data:`ZERO3_VARIANTS` row: the formula on ``fsdp2``).

    Raises:
        ValueError: the layout cannot be laid out for this model (e.g. no ``tp_plan``).
        StopIteration: an unknown layout name.
    """
    source = resolve_model(name)
    if layout in ZERO3_VARIANTS:
        zero3_settings = Zero3Settings.from_config(ZERO3_VARIANTS[layout])
        fsdp2 = _fsdp2_count(name, world_size, shape)
        sizes = fsdp2.zero3_sizes
        if zero3_settings.param_persistence_threshold != ZERO3_DEFAULTS.param_persistence_threshold:
            # torch 2.13: torch/_subclasses/fake_tensor.py:1432 (private; shapes without allocating)
            from torch._subclasses.fake_tensor import FakeTensorMode

            with FakeTensorMode():
                sizes = zero3_sizes(source.build(), world_size, zero3_settings.param_persistence_threshold)
        memory, comms, _ = zero3_from_fsdp2(
            fsdp2.memory, fsdp2.collective_bytes, sizes, shape, zero3_settings
        )
        return replace(fsdp2, memory=memory, collective_bytes=comms, zero3_sizes=sizes)
    candidate = next(c for c in validation_candidates(world_size) if c.name == layout)
    return simulate(source, candidate, shape)


def compare(
    world_size: int, measured: dict[str, StepCount | str], shape: TrainingShape = VALIDATION_SHAPE
) -> list[ValidationRow]:
    """Simulate every (model, layout) ``measured`` holds (keys ``model/layout``) and pair the counts into rows."""
    rows = []
    for key, count in measured.items():
        name, layout = key.split("/")
        if isinstance(count, str):
            rows.append(ValidationRow(name, layout, world_size, None, None, count))
            continue
        predicted = predict(name, layout, world_size, shape)
        rows.append(ValidationRow(name, layout, world_size, predicted, count))
    return rows


def format_rows(rows: list[ValidationRow]) -> str:
    """The rows as a Markdown table: peaks in KiB, the predicted collective bytes (measured when they differ)."""
    lines = [
        "| model | layout | world | predicted peak KiB | measured peak KiB | error | collectives equal | "
        "collective bytes per step (predicted) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        if row.predicted is None or row.measured is None:
            lines.append(f"| {row.model} | {row.layout} | {row.world_size} | - | - | - | - | {row.note} |")
            continue
        comms = _listed(row.predicted.collective_bytes)
        if not row.collectives_equal:
            comms += f"; measured: {_listed(row.measured.collective_bytes)}"
        error = row.peak_error or 0.0
        lines.append(
            f"| {row.model} | {row.layout} | {row.world_size} | {row.predicted.memory.peak / 1024:.1f} | "
            f"{row.measured.memory.peak / 1024:.1f} | {error:+.1%} | "
            f"{'yes' if row.collectives_equal else 'NO'} | {comms} |"
        )
    return "\n".join(lines)
