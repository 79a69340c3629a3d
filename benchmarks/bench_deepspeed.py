"""Step time and per-process peak memory of ZeRO-1/2/3 versus DDP, same model, 2 CPU processes.

Each variant is its own ``torchrun`` launch (fresh processes, clean peak-memory counters). Every
process measures its resident-set peak growth from just before the model is built to the end of
training (``prep+train``), the peak during the training steps alone (``train``: the kernel's peak
counter is reset after ``prepare`` through ``/proc/self/clear_refs``, Linux only), and the median step
time after warm-up steps. Memory is the maximum over processes, time is rank 0's median; all memory
figures are growth over the resident size just before the model is built (MiB).

    python benchmarks/bench_deepspeed.py --width 1024 --layers 8 --steps 20

Model: ``layers`` x Linear(width, width) (8 x 1024^2 = 8.4M parameters, 34 MB in fp32), AdamW
(8 bytes of optimizer state per parameter), batch 8 per process, fp32. ``zero3init`` builds the
model under ``deepspeed.zero.Init`` (``zero3_init_flag``), so the full model never exists in one process;
``zero2small`` / ``zero3small`` use 2M-element communication buckets instead of DeepSpeed's GPU-sized
defaults (see ``SMALL_BUCKETS``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

SMALL_BUCKETS = {
    "reduce_bucket_size": 2_000_000,
    "allgather_bucket_size": 2_000_000,
    "stage3_prefetch_bucket_size": 2_000_000,
    "stage3_max_live_parameters": 2_000_000,
    "stage3_param_persistence_threshold": 10_000,
}


def _rss_kib(field: str) -> int:
    """``VmHWM`` (peak) or ``VmRSS`` (current) of this process in KiB, from /proc/self/status."""
    with open("/proc/self/status", encoding="ascii") as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _reset_peak() -> None:
    import ctypes
    import gc

    # Memory freed while building (the unsharded model, flattening copies) stays in glibc's heap and
    # would count as resident; hand it back to the OS so the training peak shows live memory.
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/clear_refs", "w", encoding="ascii") as handle:
        handle.write("5")  # resets VmHWM to the current RSS


def worker(variant: str, width: int, layers: int, steps: int, warmup: int, out: str) -> None:
    """One process of one variant: build, prepare, train, write its measurements to ``out``."""
    import torch

    from accelerando import Accelerator, DeepSpeedPlugin

    torch.manual_seed(0)
    plugin = None
    if variant != "ddp":
        stage = int(variant[len("zero")])
        config = {"zero_optimization": {"stage": stage}, "train_micro_batch_size_per_gpu": "auto"}
        if variant.endswith("small"):
            # DeepSpeed's default buckets (5e8 elements) exceed this whole model, so every bucket
            # holds all of it; GPU-sized defaults hide sharding's saving on a small CPU model.
            config["zero_optimization"].update(SMALL_BUCKETS)
        plugin = DeepSpeedPlugin(hf_ds_config=config, zero3_init_flag=variant.endswith("init"))
    acc = Accelerator(deepspeed_plugin=plugin)
    if variant != "ddp":
        import deepspeed  # noqa: F401 - the library's own import is not the model's memory

    before = _rss_kib("VmRSS")
    with plugin.zero3_init_context_manager() if plugin is not None else contextlib.nullcontext():
        model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    data = torch.utils.data.TensorDataset(torch.randn(8 * (steps + warmup) * 2, width))
    loader = torch.utils.data.DataLoader(data, batch_size=8)
    model, opt, loader = acc.prepare(model, opt, loader)
    prep_peak = _rss_kib("VmHWM")
    _reset_peak()
    after_prepare = _rss_kib("VmRSS")
    times = []
    for i, (x,) in enumerate(loader):
        start = time.perf_counter()
        loss = model(x).pow(2).mean()
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
        if i >= warmup:
            times.append(time.perf_counter() - start)
        if i + 1 >= steps + warmup:
            break
    train_peak = _rss_kib("VmHWM")
    result = {
        "rank": acc.process_index,
        "step_s": statistics.median(times),
        "peak_mib": (max(prep_peak, train_peak) - before) / 1024,
        "train_peak_mib": (train_peak - before) / 1024,
        "prepared_mib": (after_prepare - before) / 1024,
    }
    with open(f"{out}.{acc.process_index}", "w", encoding="utf-8") as handle:
        json.dump(result, handle)


def run_variant(variant: str, args: argparse.Namespace) -> dict[str, float]:
    """Launch one variant on 2 processes; return rank 0's step time and the max peak growth."""
    from accelerando.test_utils import get_free_port

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result")
        cmd = [
            sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={get_free_port()}",
            __file__, "--worker", variant, "--width", str(args.width), "--layers", str(args.layers),
            "--steps", str(args.steps), "--warmup", str(args.warmup), "--out", out,
        ]  # fmt: skip
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"{variant} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        ranks = [json.load(open(f"{out}.{r}", encoding="utf-8")) for r in range(2)]
    return {
        "step_ms": ranks[0]["step_s"] * 1000,
        "peak_mib": max(r["peak_mib"] for r in ranks),
        "train_peak_mib": max(r["train_peak_mib"] for r in ranks),
        "prepared_mib": max(r["prepared_mib"] for r in ranks),
    }


def main() -> None:
    """Parse arguments; run as the benchmark driver or as one worker process."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--variants", default="ddp,zero1,zero2,zero3,zero3init,zero2small,zero3small")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.width, args.layers, args.steps, args.warmup, args.out)
        return
    params = args.layers * (args.width * args.width + args.width)
    print(
        f"model: {params / 1e6:.1f}M parameters ({params * 4 / 2**20:.0f} MiB fp32), AdamW, 2 CPU processes"
    )
    print(
        f"{'variant':<10} {'step ms':>9} {'peak MiB prep+train':>20} {'after prepare':>14} {'peak train':>11}"
    )
    for variant in args.variants.split(","):
        r = run_variant(variant, args)
        print(
            f"{variant:<10} {r['step_ms']:>9.1f} {r['peak_mib']:>20.0f} {r['prepared_mib']:>14.0f} "
            f"{r['train_peak_mib']:>11.0f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
