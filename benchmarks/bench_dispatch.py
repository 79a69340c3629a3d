"""Benchmark: dispatch mode (the main process reads, every process gets its part) against a hand-written
``dist.scatter`` of the same batches, per step, on 2 processes.

Data: an iterable stream of image-like samples (3 x 128 x 128 float32, 196 KB), batch 32 (6.3 MB per
process per step), no compute. The prepared loader is ``Accelerator.prepare`` of a ``DataLoader`` over
an ``IterableDataset`` (dispatch is the default there); the hand-written loop reads ``world`` batches on
the main process and calls ``dist.scatter``. Runs alternate; the first of each is a warm-up.

Run: python -m torch.distributed.run --nproc_per_node 2 benchmarks/bench_dispatch.py [--rounds 4] [--steps 60]
     [--batch-size 32] [--sample-floats 49152]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, IterableDataset


class _Stream(IterableDataset):
    def __init__(self, length: int, shape: tuple[int, ...]) -> None:
        self.length, self.shape = length, shape

    def __iter__(self):
        for i in range(self.length):
            yield torch.full(self.shape, float(i))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--sample-floats", type=int, default=3 * 128 * 128, help="floats per sample")
    args = parser.parse_args()

    from accelerando import Accelerator, DataLoaderConfiguration

    accelerator = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(dispatch_batches=True))
    rank, world = accelerator.process_index, accelerator.num_processes
    shape, batch = (args.sample_floats,), args.batch_size
    samples = batch * world * args.steps
    prepared = accelerator.prepare(DataLoader(_Stream(samples, shape), batch_size=batch))

    def ours() -> int:
        return sum(1 for _ in prepared)

    def handmade() -> int:
        source = iter(DataLoader(_Stream(samples, shape), batch_size=batch)) if rank == 0 else None
        for _ in range(args.steps):
            out = torch.empty((batch, *shape))
            parts = [next(source) for _ in range(world)] if rank == 0 else None
            dist.scatter(out, parts, src=0)
        return args.steps

    times: dict[str, list[float]] = {"prepared": [], "raw": []}
    for round_index in range(args.rounds + 1):
        for name, fn in (("prepared", ours), ("raw", handmade))[:: 1 if round_index % 2 == 0 else -1]:
            dist.barrier()
            start = time.perf_counter()
            steps = fn()
            dist.barrier()
            if round_index:  # the first round warms up both
                times[name].append((time.perf_counter() - start) / steps)
    if rank == 0:
        prepared_ms, raw_ms = (statistics.median(times[k]) * 1e3 for k in ("prepared", "raw"))
        print(f"dispatch: {prepared_ms:.2f} ms/step, hand-written scatter: {raw_ms:.2f} ms/step")
        print(f"ratio prepared/raw: {prepared_ms / raw_ms:.3f}")


if __name__ == "__main__":
    main()
