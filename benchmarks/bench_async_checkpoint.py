"""Training stall per checkpoint: synchronous ``save_state()`` vs ``save_state(async_save=True)``.

A model of about 300 MB of Linear weights (fp32) with an SGD optimizer (no state) is saved into a
project folder. The stall is the time ``save_state`` keeps the training thread: the whole save when
synchronous, the folder claim plus the host-memory snapshot when asynchronous (the write, fsync,
checksums and commit then run in the background, timed separately through ``result()``).

Run: ``python benchmarks/bench_async_checkpoint.py [--mb 300] [--repeats 3]``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch


def main() -> None:
    """Print the stall of each mode and their ratio."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=int, default=300, help="model size in MB")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    from accelerando import Accelerator
    from accelerando.utils import ProjectConfiguration

    width = 2048
    layers = max(1, args.mb * 2**20 // (width * width * 4))
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    with tempfile.TemporaryDirectory() as folder:
        config = ProjectConfiguration(project_dir=folder, automatic_checkpoint_naming=True, total_limit=2)
        accelerator = Accelerator(project_config=config)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model, optimizer = accelerator.prepare(model, optimizer)
        sync, stall, background = [], [], []
        for _ in range(args.repeats):
            start = time.perf_counter()
            accelerator.save_state()
            sync.append(time.perf_counter() - start)
        accelerator.save_state(async_save=True).result()  # the first one allocates the host buffers
        for _ in range(args.repeats):
            start = time.perf_counter()
            handle = accelerator.save_state(async_save=True)
            stall.append(time.perf_counter() - start)
            handle.result()
            background.append(time.perf_counter() - start)
    s, a, b = statistics.median(sync), statistics.median(stall), statistics.median(background)
    print(
        "sync stalls (ms):",
        [round(x * 1000) for x in sync],
        "async stalls (ms):",
        [round(x * 1000) for x in stall],
    )
    print(f"model: {size / 2**20:.0f} MiB of Linear weights ({layers} x {width}x{width})")
    print(f"synchronous save_state: stall {s * 1000:.0f} ms")
    print(
        f"async_save=True:        stall {a * 1000:.0f} ms ({a / s:.1%} of the synchronous save); commit after {b * 1000:.0f} ms"
    )


if __name__ == "__main__":
    main()
