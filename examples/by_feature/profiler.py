"""Profiling: see where the training step spends its time, with torch.profiler under the hood.

``ProfileKwargs`` holds the profiler's options (activities, a wait/warmup/active schedule, shapes,
memory, FLOPs, a folder for Chrome traces); pass it in ``kwargs_handlers`` and wrap the steps in
``with accelerator.profile() as prof:``, calling ``prof.step()`` after each. Each process writes its
own trace into ``output_trace_dir``; open one at https://ui.perfetto.dev or chrome://tracing.

    accelerando launch --cpu --num_processes 2 examples/by_feature/profiler.py --tiny

The last line printed is ``METRICS {...}``: the trace files written and the costliest operators.
"""

from __future__ import annotations

import argparse
import json
import os

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from tqdm.auto import tqdm

from accelerando import Accelerator, ProfileKwargs
from accelerando.utils import set_seed


def make_data(n: int, seed: int) -> TensorDataset:
    """Four noisy Gaussian clusters in 8 dimensions, labelled by cluster."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(4, 8, generator=torch.Generator().manual_seed(0)) * 2
    labels = torch.randint(0, 4, (n,), generator=g)
    return TensorDataset(centres[labels] + torch.randn(n, 8, generator=g), labels)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--trace_dir", default="examples_output/profiler")
    parser.add_argument("--active_steps", type=int, default=5, help="steps recorded after 1 wait + 1 warmup")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tiny", action="store_true", help="a handful of steps")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    active = 2 if args.tiny else args.active_steps
    profile_kwargs = ProfileKwargs(
        activities=["cpu"],  # add "cuda" on GPUs
        schedule_option={"wait": 1, "warmup": 1, "active": active, "repeat": 1},
        record_shapes=True,
        profile_memory=True,
        with_flops=True,
        output_trace_dir=args.trace_dir,
    )
    set_seed(args.seed)
    accelerator = Accelerator(kwargs_handlers=[profile_kwargs])
    model = nn.Sequential(nn.Linear(8, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    train = DataLoader(make_data(512, args.seed), batch_size=32, shuffle=True)
    model, optimizer, train = accelerator.prepare(model, optimizer, train)

    steps = 2 + active
    batches = iter(train)
    with accelerator.profile() as prof:
        for _ in tqdm(range(steps), disable=not accelerator.is_local_main_process):
            inputs, labels = next(batches)
            accelerator.backward(nn.functional.cross_entropy(model(inputs), labels))
            optimizer.step()
            optimizer.zero_grad()
            prof.step()  # advances the wait/warmup/active schedule

    table = prof.key_averages()
    accelerator.print(table.table(sort_by="self_cpu_time_total", row_limit=8))
    top = sorted(table, key=lambda event: event.self_cpu_time_total, reverse=True)[:5]
    accelerator.wait_for_everyone()  # every process has written its trace
    metrics = {
        "profiled_steps": active,
        "top_ops": [event.key for event in top],
        "traces": sorted(os.listdir(args.trace_dir)),
    }
    accelerator.print("METRICS " + json.dumps(metrics))
    accelerator.end_training()


if __name__ == "__main__":
    main()
