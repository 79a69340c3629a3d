"""Validation of the planner's simulator: predicted vs measured per-rank peak memory and collective bytes.

For the tiny Llama, GPT-2 and T5 configs (``accelerando.backends.planning.validation``), at world sizes 1, 2 and
4, for DDP, ZeRO-3 / FSDP2 and FSDP2 x TP (tp=2): the simulation (fake tensors, fake process group,
one process) against a measured run (real tensors, gloo, ``world_size`` CPU processes), both counted by
the same live-tensor tracker and collective counter. DeepSpeed ZeRO-3 (row ``zero3``) is measured through
``Accelerator`` with ``DeepSpeedPlugin(zero_stage=3)`` (``tests/planning/planning_deepspeed.py``, one
launch per model: DeepSpeed's CPU op must be built, as ``tests/conftest.py`` does) and predicted by the
planner's DeepSpeed formula on the ``fsdp2`` simulation. Prints a Markdown table (the one in
docs/guides/planning.md) and exits 1 when a peak differs by more than 10 % or a collective's bytes
differ.

Run: ``python benchmarks/bench_plan_validation.py [--world_sizes 1 2 4] [--models tiny-llama ...]
[--layouts zero3 zero3_small_buckets]`` (``--layouts`` keeps some rows: ``ddp``, ``fsdp2``, ``fsdp2_tp2``,
``zero3``, ``zero3_small_buckets``).

``--scale 8 64 512 4096`` instead times one FSDP2 simulation of the tests' small model
(``tests/planning/planning_toy.py``) per world size, after a warm-up one, and counts its Python calls
(cProfile: the figure a shared machine's load does not change); it prints the per-rank peak and
collective bytes too, so two revisions can be checked for identical results.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path

__all__ = ["main"]


def scale(world_sizes: list[int]) -> str:
    """One FSDP2 simulation of the toy model per world size: a Markdown table of time, calls and counts."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "planning"))
    from planning_toy import toy_source

    from accelerando.backends.planning.simulate import simulate
    from accelerando.backends.planning.spec import Candidate, TrainingShape

    shape = TrainingShape(micro_batch=2, seq_length=16, mixed_precision="no")
    simulate(toy_source(), Candidate("fsdp2", dp_shard=8, zero_stage=3), shape)  # imports and warm-up
    lines = [
        "| world size | wall s | Python calls | peak B per rank | collective bytes per rank |",
        "|---|---|---|---|---|",
    ]
    for world in world_sizes:
        profile = cProfile.Profile()
        start = time.perf_counter()
        profile.enable()
        count = simulate(toy_source(), Candidate("fsdp2", dp_shard=world, zero_stage=3), shape)
        profile.disable()
        wall = time.perf_counter() - start
        calls = pstats.Stats(profile).total_calls  # pyright: ignore[reportAttributeAccessIssue]
        comms = ", ".join(f"{k}: {v}" for k, v in sorted(count.collective_bytes.items()))
        lines.append(f"| {world} | {wall:.1f} | {calls:,} | {count.memory.peak} | {comms} |")
        print(lines[-1], file=sys.stderr, flush=True)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Measure, simulate, print the table; 0 when every row is within tolerance."""
    from accelerando.backends.planning.simulate import StepCount
    from accelerando.backends.planning.validation import (
        TOLERANCE,
        VALIDATION_MODELS,
        VALIDATION_SHAPE,
        ZERO3_VARIANTS,
        compare,
        format_rows,
        measure_on_rank,
    )
    from accelerando.test_utils.distributed import run_distributed

    parser = argparse.ArgumentParser(description=(__doc__ or "bench_plan_validation").splitlines()[0])
    parser.add_argument("--world_sizes", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--models", nargs="+", default=list(VALIDATION_MODELS))
    parser.add_argument("--layouts", nargs="+", default=["ddp", "fsdp2", "fsdp2_tp2", *ZERO3_VARIANTS])
    parser.add_argument("--scale", type=int, nargs="+", default=None, metavar="WORLD_SIZE")
    args = parser.parse_args(argv)
    if args.scale:
        print(scale(args.scale))
        return 0
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "planning"))
    from planning_deepspeed import DEEPSPEED_ENV, measure_zero3_on_rank

    rows = []
    for world in args.world_sizes:
        measured: dict[str, StepCount | str] = {}
        if set(args.layouts) - set(ZERO3_VARIANTS):
            per_rank = run_distributed(
                measure_on_rank, world, args.models, world, VALIDATION_SHAPE, timeout=1800
            )
            measured.update((k, v) for k, v in per_rank[0].items() if k.split("/")[1] in args.layouts)
        for layout in [name for name in ZERO3_VARIANTS if name in args.layouts]:
            for name in args.models:
                per_rank = run_distributed(
                    measure_zero3_on_rank,
                    world,
                    name,
                    VALIDATION_SHAPE,
                    layout,
                    env=DEEPSPEED_ENV,
                    timeout=1800,
                )
                measured.update(per_rank[0])
        rows += compare(world, measured)
        print(f"world size {world}: measured and simulated; the rows so far:", file=sys.stderr)
        print(format_rows(rows), file=sys.stderr, flush=True)
    print(format_rows(rows))
    bad = [
        r
        for r in rows
        if r.peak_error is not None and (abs(r.peak_error) > TOLERANCE or not r.collectives_equal)
    ]
    for row in bad:
        print(f"OUT OF TOLERANCE: {row.model} {row.layout} world {row.world_size}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
