"""Benchmark: iterating a prepared dataloader against the raw ``DataLoader`` over the same data.

No compute: 50k samples of 16 floats, batch 32, one full epoch per measurement (shuffled, and in
order for the single-process case). Raw and prepared runs alternate; each figure is the median of
``--repeats`` epochs (the ratio of the fastest epochs is printed too: on a loaded machine it is the
steadier estimate of the intrinsic cost).

- single process: raw ``DataLoader`` vs ``prepare_data_loader(..., put_on_device=True)`` on CPU.
- 2 processes (gloo): per process, raw ``DataLoader`` + ``DistributedSampler`` (what one writes by
  hand) vs the prepared loader, which shards with ``BatchSamplerShard``.

Run: python benchmarks/bench_dataloader.py [--samples 50000] [--batch-size 32] [--repeats 15] [--no-ddp]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Iterable

import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

__all__ = ["main"]


def _epoch_time(loader: Iterable) -> float:
    # CPU time of this process: iteration is single-threaded (no workers), and CPU time is barely
    # touched by the other processes sharing the cores, unlike wall time.
    start = time.process_time()
    for _ in loader:
        pass
    return time.process_time() - start


def _compare(
    raw: Iterable, prepared: Iterable, repeats: int, batches: int, align: Callable[[], None] = lambda: None
) -> dict[str, float]:
    """Median epoch times; ``align`` runs (untimed) before each epoch, e.g. a barrier between ranks."""
    _epoch_time(raw)
    _epoch_time(prepared)
    raw_times, prep_times = [], []
    for i in range(repeats):
        order = ((raw, raw_times), (prepared, prep_times))
        for loader, times in order if i % 2 == 0 else order[::-1]:
            align()
            times.append(_epoch_time(loader))
    raw_t, prep_t = statistics.median(raw_times), statistics.median(prep_times)
    return {
        "ratio_of_minima": min(prep_times) / min(raw_times),
        "raw_s": raw_t,
        "prepared_s": prep_t,
        "ratio": prep_t / raw_t,
        "overhead_us_per_batch": (prep_t - raw_t) / batches * 1e6,
        "raw_us_per_batch": raw_t / batches * 1e6,
    }


def _dataset(samples: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(samples, 16, generator=generator), torch.arange(samples))


def single_process(samples: int, batch_size: int, repeats: int, shuffle: bool = True) -> dict[str, float]:
    """Raw vs prepared loader in this process."""
    from accelerando.data_loader import prepare_data_loader

    dataset = _dataset(samples)
    raw = DataLoader(dataset, batch_size=batch_size, shuffle=shuffle)
    prepared = prepare_data_loader(
        DataLoader(dataset, batch_size=batch_size, shuffle=shuffle),
        num_processes=1,
        process_index=0,
        put_on_device=True,
        device=torch.device("cpu"),
    )
    return _compare(raw, prepared, repeats, len(raw))


def _ddp_rank(samples: int, batch_size: int, repeats: int) -> dict[str, float]:
    from accelerando.data_loader import prepare_data_loader
    from accelerando.state import PartialState

    state = PartialState()
    dataset = _dataset(samples)
    sampler = DistributedSampler(dataset, state.num_processes, state.process_index, shuffle=True)
    raw = DataLoader(dataset, batch_size=batch_size, sampler=sampler)
    prepared = prepare_data_loader(
        DataLoader(dataset, batch_size=batch_size, shuffle=True), put_on_device=True
    )
    # Without the barrier, a rank slowed by the machine would be charged the other's waiting time in
    # the prepared loader's once-per-epoch generator synchronisation.
    return _compare(raw, prepared, repeats, len(raw), align=state.wait_for_everyone)


def two_processes(samples: int, batch_size: int, repeats: int) -> list[dict[str, float]]:
    """Raw + DistributedSampler vs prepared loader, measured in each of 2 processes."""
    from accelerando.test_utils import run_distributed

    return run_distributed(_ddp_rank, 2, samples, batch_size, repeats, timeout=900.0)


def _report(name: str, result: dict[str, float], emit: Callable[[str], None] = print) -> None:
    emit(
        f"{name}: raw {result['raw_s'] * 1e3:.1f} ms ({result['raw_us_per_batch']:.1f} us/batch), "
        f"prepared {result['prepared_s'] * 1e3:.1f} ms, ratio {result['ratio']:.3f}, "
        f"overhead {result['overhead_us_per_batch']:+.2f} us/batch (ratio of fastest epochs "
        f"{result['ratio_of_minima']:.3f})"
    )


def main() -> None:
    """Parse the arguments and print the comparison."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=50_000)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--no-ddp", action="store_true", help="skip the 2-process measurement")
    args = parser.parse_args()
    torch.set_num_threads(1)
    _report("single process, shuffled", single_process(args.samples, args.batch_size, args.repeats))
    # In order, both loaders draw indices the same way: this isolates the wrapper's own cost.
    _report("single process, in order", single_process(args.samples, args.batch_size, args.repeats, False))
    if not args.no_ddp:
        for rank, result in enumerate(two_processes(args.samples, args.batch_size, args.repeats)):
            _report(f"2 processes, rank {rank}", result)


if __name__ == "__main__":
    main()
