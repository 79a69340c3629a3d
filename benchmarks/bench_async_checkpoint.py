"""Training stall per checkpoint: synchronous ``save_state()`` vs ``save_state(async_save=True)``.

A model of about 300 MB of Linear weights (fp32, SGD without state) trains on CPU. The stall of a
save is measured as the extra wall time of a training loop of ``--steps`` steps that saves once
(after its first step) over the same loop without a save: so it counts everything the save costs
the training, whether the training thread waits for it (the folder claim, the foreground copies, an
optimizer step waiting for the background copy of the parameters) or the background thread takes
CPU or memory bandwidth from it. The loop is long enough for the background commit to end inside it
(the script says so; otherwise part of the background work would not be counted).

Variants, interleaved in each repeat, medians reported:
- ``sync``: ``save_state()``;
- ``async``: ``save_state(async_save=True)`` (the parameters are copied in the background while the
  next forward/backward runs; the next optimizer step waits for that copy);
- ``async, no overlap``: ``save_state(async_save=True, overlap_snapshot=False)`` (everything copied
  before ``save_state`` returns).

Run: ``python benchmarks/bench_async_checkpoint.py [--mb 300] [--steps 12] [--batch 16] [--repeats 3]``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch


def _loop(model: Any, optimizer: Any, accelerator: Any, batch: torch.Tensor, steps: int, save: Any) -> tuple:
    """Train ``steps`` steps, calling ``save()`` after the first; return (seconds, handle or None, done)."""
    handle = None
    start = time.perf_counter()
    for step in range(steps):
        loss = model(batch).square().mean()
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        if step == 0 and save is not None:
            handle = save()
    elapsed = time.perf_counter() - start
    done = handle is None or not hasattr(handle, "done") or handle.done()
    if hasattr(handle, "result"):
        handle.result()
    return elapsed, done


def main() -> None:
    """Print each variant's stall, the synchronous save's, and their ratio."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=int, default=300, help="model size in MB")
    parser.add_argument("--steps", type=int, default=12, help="training steps per measured loop")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    from accelerando import Accelerator
    from accelerando.utils import ProjectConfiguration

    width = 2048
    layers = max(1, args.mb * 2**20 // (width * width * 4))
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    batch = torch.randn(args.batch, width)
    with tempfile.TemporaryDirectory() as folder:
        config = ProjectConfiguration(project_dir=folder, automatic_checkpoint_naming=True, total_limit=2)
        accelerator = Accelerator(project_config=config)
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-6)
        model, optimizer = accelerator.prepare(model, optimizer)
        variants: dict[str, Callable[[], Any] | None] = {
            "no save": None,
            "sync": accelerator.save_state,
            "async": lambda: accelerator.save_state(async_save=True),
            "async, no overlap": lambda: accelerator.save_state(async_save=True, overlap_snapshot=False),
        }
        for save in variants.values():  # warm-up: allocator, host buffers, files
            _loop(model, optimizer, accelerator, batch, 2, save)
        times: dict[str, list[float]] = {name: [] for name in variants}
        late: dict[str, int] = dict.fromkeys(variants, 0)
        for _ in range(args.repeats):
            for name, save in variants.items():
                elapsed, done = _loop(model, optimizer, accelerator, batch, args.steps, save)
                times[name].append(elapsed)
                late[name] += not done
    base = statistics.median(times["no save"])
    stall = {name: statistics.median(t) - base for name, t in times.items()}
    print(f"model: {size / 2**20:.0f} MiB of Linear weights ({layers} x {width}x{width}), batch {args.batch}")
    print(f"loop of {args.steps} steps without a save: {base:.2f} s (median of {args.repeats})")
    for name in variants:
        if name == "no save":
            continue
        ratio = f" = {stall[name] / stall['sync']:.1%} of the synchronous save" if name != "sync" else ""
        note = (
            f" (background commit still running at the loop's end in {late[name]} run(s))"
            if late[name]
            else ""
        )
        loops = [round(t, 2) for t in times[name]]
        print(f"{name:>18}: stall {stall[name] * 1000:6.0f} ms{ratio}; loops {loops}{note}")


if __name__ == "__main__":
    main()
