"""Check the simulator against real runs: predicted vs measured peak memory and collective bytes.

A measured run is :func:`~accelerando.backends.planning.simulate.run_steps` with real tensors on a real gloo
process group (``world_size`` CPU processes); the prediction is the same function on fake tensors and
the fake process group. Both count with the same trackers (:mod:`.tracking`), so "measured peak" is
the largest sum of live tensor storage bytes on rank 0 during two training steps, not an allocator
statistic (CPU has none). The benchmark ``benchmarks/bench_plan_validation.py`` prints the table; the
slow tests in ``tests/planning`` fail when a prediction drifts past :data:`TOLERANCE`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist

from accelerando.backends.planning.models import resolve_model
from accelerando.backends.planning.simulate import StepCount, run_steps, simulate
from accelerando.backends.planning.spec import Candidate, TrainingShape

__all__ = [
    "TOLERANCE",
    "VALIDATION_MODELS",
    "VALIDATION_SHAPE",
    "ValidationRow",
    "compare",
    "format_rows",
    "measure_on_rank",
    "validation_candidates",
]

#: Largest relative peak-memory error a prediction may have.
TOLERANCE = 0.10
#: The models validated (built-in tiny configs).
VALIDATION_MODELS: tuple[str, ...] = ("tiny-llama", "tiny-gpt2", "tiny-t5")
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


def compare(
    world_size: int, measured: dict[str, StepCount | str], shape: TrainingShape = VALIDATION_SHAPE
) -> list[ValidationRow]:
    """Simulate every (model, candidate) ``measured`` holds and pair the counts into rows."""
    rows = []
    for key, count in measured.items():
        name, layout = key.split("/")
        candidate = next(c for c in validation_candidates(world_size) if c.name == layout)
        if isinstance(count, str):
            rows.append(ValidationRow(name, layout, world_size, None, None, count))
            continue
        rows.append(
            ValidationRow(name, layout, world_size, simulate(resolve_model(name), candidate, shape), count)
        )
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
