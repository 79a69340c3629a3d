"""Step-time overhead of the MemoryMonitor: a small CPU training loop with the monitor off and on.

Run: ``python benchmarks/bench_monitor.py [--steps 300] [--rounds 5] [--hidden 512] [--device cuda]``
(on a GPU the step synchronises, and the monitor also reads the CUDA counters and NVML sensors).

Off and on blocks are interleaved (off, on, off, on, ...) so that load from other processes hits both
alike; the reported figure is the ratio of the median per-step times, plus the cost of one
``monitor.step()`` call measured alone.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from accelerando.backends.monitoring import MemoryMonitor


def _train_block(
    model: torch.nn.Module, opt: torch.optim.Optimizer, steps: int, monitor: MemoryMonitor | None
) -> list[float]:
    device = next(model.parameters()).device
    batch = torch.randn(64, model[0].in_features, device=device)
    times = []
    for step in range(steps):
        start = time.perf_counter()
        loss = model(batch).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if monitor is not None:
            monitor.step(step)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, args.hidden), torch.nn.ReLU(), torch.nn.Linear(args.hidden, 10)
    ).to(args.device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    _train_block(model, opt, 50, None)  # warm-up
    off: list[float] = []
    on: list[float] = []
    for _ in range(args.rounds):
        off += _train_block(model, opt, args.steps, None)
        monitor = MemoryMonitor(window=50).start()
        on += _train_block(model, opt, args.steps, monitor)
        monitor.stop()
    monitor = MemoryMonitor(window=50).start()
    start = time.perf_counter()
    for step in range(2000):
        monitor.step(step)
    per_call_us = (time.perf_counter() - start) / 2000 * 1e6
    monitor.stop()
    off_ms, on_ms = statistics.median(off) * 1e3, statistics.median(on) * 1e3
    print(f"median step time off: {off_ms:.3f} ms, on: {on_ms:.3f} ms, ratio on/off: {on_ms / off_ms:.4f}")
    print(
        f"monitor.step() alone: {per_call_us:.1f} us per call ({per_call_us / 1e3 / off_ms * 100:.2f}% of a step)"
    )


if __name__ == "__main__":
    main()
