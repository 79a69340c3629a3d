"""Memory: find the largest batch size that fits, then train with a memory monitor running.

``find_executable_batch_size`` retries a function with other batch sizes when it runs out of memory.
Here it wraps a one-step probe (forward and backward at that size), so the search costs a few steps
rather than a few trainings: it starts high and, after each failure, tries ``int(size * 0.9)`` until a
size runs (the first success ends the search). ``accelerator.enable_memory_monitor`` samples the
process's memory at every optimizer step, warns about steady growth, and at ``end_training`` writes
``memory_rank<k>.json`` (and a PNG timeline when matplotlib is installed) into the project folder.

A CPU seldom runs out of memory, so ``--simulate_memory_for N`` makes any batch above N samples raise
the out-of-memory error a GPU would.

    accelerando launch --cpu --num_processes 2 examples/by_feature/memory.py --tiny --simulate_memory_for 40

The last line printed is ``METRICS {...}``: the batch size found, the sizes tried, peak memory, files.
"""

from __future__ import annotations

import argparse
import json
import os

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from tqdm.auto import tqdm

from accelerando import Accelerator, find_executable_batch_size
from accelerando.utils import set_seed


def make_data(n: int, seed: int) -> TensorDataset:
    """Four noisy Gaussian clusters in 8 dimensions, labelled by cluster."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(4, 8, generator=torch.Generator().manual_seed(0)) * 2
    labels = torch.randint(0, 4, (n,), generator=g)
    return TensorDataset(centres[labels] + torch.randn(n, 8, generator=g), labels)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--starting_batch_size", type=int, default=64)
    parser.add_argument("--simulate_memory_for", type=int, default=0, help="largest batch that 'fits'")
    parser.add_argument("--project_dir", default="examples_output/memory")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tiny", action="store_true", help="small data: a few seconds on a CPU")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    epochs = 2 if args.tiny else args.epochs
    set_seed(args.seed)
    accelerator = Accelerator(project_dir=args.project_dir)
    data = make_data(512 if args.tiny else 8192, args.seed)
    model = nn.Sequential(nn.Linear(8, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model, optimizer = accelerator.prepare(model, optimizer)

    def step(inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if args.simulate_memory_for and inputs.shape[0] > args.simulate_memory_for:
            raise torch.OutOfMemoryError(f"simulated: a batch of {inputs.shape[0]} does not fit")
        loss = nn.functional.cross_entropy(model(inputs), labels)
        accelerator.backward(loss)
        return loss

    @find_executable_batch_size(starting_batch_size=args.starting_batch_size)
    def probe(batch_size: int) -> None:
        inputs, labels = data[:batch_size]
        step(inputs.to(accelerator.device), labels.to(accelerator.device))
        optimizer.zero_grad()  # a probe only: no optimizer step

    probe()
    batch_size = probe.batch_size
    accelerator.print(f"largest batch that runs: {batch_size} (tried {probe.tries})")

    loader = accelerator.prepare(DataLoader(data, batch_size=batch_size, shuffle=True))
    monitor = accelerator.enable_memory_monitor(window=8)
    losses = []
    bar = tqdm(total=epochs * len(loader), disable=not accelerator.is_local_main_process)
    for _ in range(epochs):
        for inputs, labels in loader:
            losses.append(step(inputs, labels).item())
            optimizer.step()
            optimizer.zero_grad()
            bar.update()
    bar.close()
    summary = monitor.summary()
    accelerator.end_training()  # stops the monitor and writes its files

    memory_dir = os.path.join(args.project_dir, "memory")
    metrics = {
        "batch_size": batch_size,
        "tries": probe.tries,
        "samples": summary["samples"],
        "peak_rss_mb": summary.get("peak_cpu_rss", 0) / 2**20,
        "leaks": len(summary["leaks"]),
        "first_loss": losses[0],
        "last_loss": losses[-1],
        "files": sorted(os.listdir(memory_dir)) if os.path.isdir(memory_dir) else [],
    }
    accelerator.print("METRICS " + json.dumps(metrics))


if __name__ == "__main__":
    main()
