"""Overhead of the prepared training loop over a raw PyTorch loop doing the same work.

One epoch of a 3-layer MLP (batch 64, 1 thread) is timed as (a) a raw PyTorch loop over a plain
DataLoader, (b) the accelerando-prepared loop, (c) the prepared loop inside ``accumulate`` with
accumulation 2 (against a raw loop that also accumulates 2). Variants are interleaved, repeated, and
the median epoch times are compared as ratios (prepared / raw) measured in the same run.

    python benchmarks/bench_training_step.py                      # single process, widths 512 and 32
    python -m torch.distributed.run --nproc_per_node 2 benchmarks/bench_training_step.py   # 2-process DDP

On a machine with a GPU the Accelerator puts the model there; the raw loop then moves each batch to
the device itself (pinned memory, non_blocking), and every epoch ends with a synchronisation.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import os
import statistics
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def build(width: int, n: int) -> tuple[nn.Module, TensorDataset]:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 1)
    )
    return model, TensorDataset(torch.randn(n, width), torch.randn(n, 1))


def raw_epoch(
    model: nn.Module,
    opt: torch.optim.Optimizer,
    loader: DataLoader,
    accumulation: int,
    device: torch.device | None = None,
) -> None:
    for i, (x, y) in enumerate(loader):
        if device is not None:  # a hand-written GPU loop moves each batch itself
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        if accumulation == 1:
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            opt.zero_grad()
            continue
        # The last batch of the epoch steps too, as the prepared loop's ``accumulate`` does (and as a
        # correct hand-written loop must): left over, its gradients would leak into the next epoch,
        # and the raw loop would do one all-reduce and one optimizer step fewer per epoch.
        sync = (i + 1) % accumulation == 0 or i + 1 == len(loader)
        # DDP decides at forward time whether the backward all-reduces: forward inside no_sync too.
        skip = not sync and hasattr(model, "no_sync")
        with model.no_sync() if skip else contextlib.nullcontext():
            (nn.functional.mse_loss(model(x), y) / accumulation).backward()
        if sync:
            opt.step()
            opt.zero_grad()


def prepared_epoch(acc, model, opt, loader, accumulation: int) -> None:  # type: ignore[no-untyped-def]
    if accumulation > 1:
        for x, y in loader:
            with acc.accumulate(model):
                acc.backward(nn.functional.mse_loss(model(x), y))
                opt.step()
                opt.zero_grad()
    else:
        for x, y in loader:
            acc.backward(nn.functional.mse_loss(model(x), y))
            opt.step()
            opt.zero_grad()


def measure(width: int, accumulation: int, reps: int, n: int) -> tuple[float, float, float]:
    from accelerando import Accelerator
    from accelerando.state import AcceleratorState, GradientState

    AcceleratorState._reset_state()
    GradientState._reset_state()
    acc = Accelerator(gradient_accumulation_steps=accumulation)
    model, data = build(width, n)
    world, rank = acc.num_processes, acc.process_index
    # One process: both loops train the very same module (prepare returns it unchanged), so the
    # comparison cannot be skewed by where two copies of the weights happen to sit in memory.
    raw_model = model if world == 1 else copy.deepcopy(model)
    if world > 1:
        from torch.nn.parallel import DistributedDataParallel

        if acc.device.type == "cuda":
            raw_model = DistributedDataParallel(raw_model.to(acc.device), device_ids=[acc.device.index])
        else:
            raw_model = DistributedDataParallel(raw_model)
        # The raw loop shards like the prepared one: every world-th batch.
        indices = [i for b in range(rank, n // 64, world) for i in range(b * 64, b * 64 + 64)]
        raw_loader = DataLoader(torch.utils.data.Subset(data, indices), batch_size=64)
    else:
        raw_loader = DataLoader(data, batch_size=64)
    on_gpu = acc.device.type != "cpu"
    raw_device = acc.device if on_gpu else None
    pin = acc.device.type == "cuda"
    raw_loader = DataLoader(raw_loader.dataset, batch_size=64, pin_memory=pin)
    raw_opt = torch.optim.SGD(raw_model.parameters(), lr=1e-3)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    model, opt, loader = acc.prepare(model, opt, DataLoader(data, batch_size=64, pin_memory=pin))
    times: dict[tuple[str, str], list[float]] = {}
    for rep in range(reps + 1):  # the first round warms up and is dropped
        for name in ("raw", "prep") if rep % 2 == 0 else ("prep", "raw"):
            acc.wait_for_everyone()
            wall, cpu = time.perf_counter(), time.process_time()
            if name == "raw":
                raw_epoch(raw_model, raw_opt, raw_loader, accumulation, raw_device)
            else:
                prepared_epoch(acc, model, opt, loader, accumulation)
            if pin:
                torch.cuda.synchronize(acc.device)
            if rep:
                times.setdefault((name, "wall"), []).append(time.perf_counter() - wall)
                # CPU time of this process: with one thread it is barely touched by other load.
                times.setdefault((name, "cpu"), []).append(time.process_time() - cpu)
    med = {key: statistics.median(values) for key, values in times.items()}
    # The fastest epoch of each variant estimates its intrinsic cost on a noisy machine.
    med.update({(name, "cpu-min"): min(times[(name, "cpu")]) for name in ("raw", "prep")})
    # Each round runs both variants back to back; the median of the per-round ratios is robust to
    # the slow drifts of a shared machine.
    paired = [p / r for p, r in zip(times[("prep", "cpu")], times[("raw", "cpu")], strict=True)]
    med[("paired", "ratio")] = statistics.median(paired)
    return med, len(loader)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=41)
    parser.add_argument("--samples", type=int, default=64 * 100)
    parser.add_argument("--widths", type=int, nargs="+", default=[512, 32])
    args = parser.parse_args()
    torch.set_num_threads(1)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    for width in args.widths:
        for accumulation in (1, 2):
            med, steps = measure(width, accumulation, args.reps, args.samples)
            if int(os.environ.get("RANK", "0")) == 0:
                parts = []
                for clock in ("wall", "cpu", "cpu-min"):
                    raw, prep = med[("raw", clock)], med[("prep", clock)]
                    parts.append(
                        f"{clock}: raw {raw * 1e3:7.1f} ms prepared {prep * 1e3:7.1f} ms "
                        f"ratio {prep / raw:.3f} ({(prep - raw) / steps * 1e6:+.1f} us/step)"
                    )
                parts.append(f"paired cpu ratio {med[('paired', 'ratio')]:.3f}")
                print(
                    f"processes={world} width={width:4d} accumulation={accumulation} | " + " | ".join(parts),
                    flush=True,
                )


if __name__ == "__main__":
    main()
