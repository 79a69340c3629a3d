"""Benchmark: FSDP2 / FSDP1 against DDP on 2 CPU processes (gloo): peak memory and step time.

Model: a stack of ``--layers`` square linear layers of width ``--width`` (default 8 x 1024 x 1024,
about 34 MB of fp32 weights) trained with AdamW on random data. Each variant runs in fresh
processes (so peak RSS is the variant's own): the model is built, prepared, trained
``--warmup`` steps, then ``--steps`` timed steps. Reported per process: the growth of RSS from
just before the model is built to the peak during training (weights, gradients, optimizer state,
gathered parameters, activations), and the median step time.

glibc keeps freed blocks of up to 32 MB in its heaps, which makes RSS track the allocator's
history rather than live tensors; the children therefore run with ``MALLOC_MMAP_THRESHOLD_=65536``
(blocks above 64 KB are mapped and returned on free) unless the variable is already set.

Run: python benchmarks/bench_fsdp.py [--width 1024] [--layers 8] [--steps 10] [--warmup 2]
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import torch


def _sampler(stop: threading.Event, peak: list[int]) -> None:
    import psutil

    proc = psutil.Process()
    while not stop.is_set():
        peak[0] = max(peak[0], proc.memory_info().rss)
        stop.wait(0.002)


def _variant(name: str, width: int, layers: int, steps: int, warmup: int) -> dict[str, float]:
    """One variant in this process (run by every rank)."""
    import psutil

    from accelerando import Accelerator, FullyShardedDataParallelPlugin
    from accelerando.state import AcceleratorState, GradientState

    AcceleratorState._reset_state()
    GradientState._reset_state()
    plugin = None
    if name != "ddp":
        version = 1 if name == "fsdp1" else 2
        plugin = FullyShardedDataParallelPlugin(
            fsdp_version=version, auto_wrap_policy="SIZE_BASED_WRAP", min_num_params=width * width
        )
    acc = Accelerator(fsdp_plugin=plugin)
    # Warm up imports and process-group paths on a tiny model so they do not count as memory.
    acc.prepare(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)))
    baseline = psutil.Process().memory_info().rss
    stop, peak = threading.Event(), [baseline]
    thread = threading.Thread(target=_sampler, args=(stop, peak), daemon=True)
    thread.start()
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, opt = acc.prepare(model, opt)
    x = torch.randn(16, width)
    times = []
    for step in range(warmup + steps):
        start = time.perf_counter()
        loss = model(x).square().mean()
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
        if step >= warmup:
            times.append(time.perf_counter() - start)
    stop.set()
    thread.join()
    return {"peak_mb": (peak[0] - baseline) / 2**20, "step_ms": 1000 * statistics.median(times)}


def main() -> None:
    """Run every variant in fresh 2-process jobs and print one table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    args = parser.parse_args()

    import os

    from accelerando.test_utils import run_distributed

    # Read by glibc when each child process starts (see the module docstring).
    os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", "65536")

    weights_mb = args.layers * (args.width * args.width + args.width) * 4 / 2**20
    print(
        f"model: {args.layers} x Linear({args.width}, {args.width}) = {weights_mb:.1f} MB fp32; AdamW; 2 processes"
    )
    print(f"{'variant':<8} {'rank':>4} {'peak RSS growth MB':>19} {'median step ms':>15}")
    for name in ("ddp", "fsdp2", "fsdp1"):
        results = run_distributed(
            _variant, 2, name, args.width, args.layers, args.steps, args.warmup, timeout=1200
        )
        for rank, res in enumerate(results):
            print(f"{name:<8} {rank:>4} {res['peak_mb']:>19.1f} {res['step_ms']:>15.1f}")


if __name__ == "__main__":
    main()
