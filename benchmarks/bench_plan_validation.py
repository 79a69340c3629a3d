"""Validation of the planner's simulator: predicted vs measured per-rank peak memory and collective bytes.

For the tiny Llama, GPT-2 and T5 configs (``accelerando.planning.validation``), at world sizes 1, 2 and
4, for DDP, ZeRO-3 / FSDP2 and FSDP2 x TP (tp=2): the simulation (fake tensors, fake process group,
one process) against a measured run (real tensors, gloo, ``world_size`` CPU processes), both counted by
the same live-tensor tracker and collective counter. Prints a Markdown table (the one in
docs/guides/planning.md) and exits 1 when a peak differs by more than 10 % or a collective's bytes
differ.

Run: ``python benchmarks/bench_plan_validation.py [--world_sizes 1 2 4] [--models tiny-llama ...]``.
"""

from __future__ import annotations

import argparse
import sys

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Measure, simulate, print the table; 0 when every row is within tolerance."""
    from accelerando.planning.validation import (
        TOLERANCE,
        VALIDATION_MODELS,
        VALIDATION_SHAPE,
        compare,
        format_rows,
        measure_on_rank,
    )
    from accelerando.test_utils.distributed import run_distributed

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world_sizes", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--models", nargs="+", default=list(VALIDATION_MODELS))
    args = parser.parse_args(argv)
    rows = []
    for world in args.world_sizes:
        per_rank = run_distributed(measure_on_rank, world, args.models, world, VALIDATION_SHAPE, timeout=1800)
        rows += compare(world, per_rank[0])
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
