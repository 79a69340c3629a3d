"""Benchmark: ``Accelerator.save_state`` / ``load_state`` against raw safetensors + ``torch.save``.

Model: ~400 MB of fp32 weights plus AdamW state (2 x 400 MB). Raw save = ``safetensors.save_file``
of the weights and ``torch.save`` of the optimizer state, then ``fsync`` of both files (the fsync
share is reported). Raw load = ``safetensors.load_file`` + ``torch.load(weights_only=True)``.
Every figure is the median of ``--repeats`` runs with a warm page cache.

Run: python benchmarks/bench_checkpoint.py [--size-mb 400] [--repeats 3] [--dir /tmp/bench_ckpt]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import time
import zlib
from collections.abc import Callable

import torch


def _median_time(fn: Callable[[], None], repeats: int, before: Callable[[], None] | None = None) -> float:
    times = []
    for _ in range(repeats):
        if before is not None:
            before()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def build(size_mb: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """A stack of square linear layers holding ``size_mb`` MB of fp32 weights, after one AdamW step."""
    width = 2048
    layers = max(1, round(size_mb * 2**20 / (4 * (width * width + width))))
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model(torch.randn(2, width)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
    return model, optimizer


def checksum_speed(nbytes: int = 256 * 2**20) -> dict[str, float]:
    """MB/s of the checksum candidates over ``nbytes`` of random data."""
    data = os.urandom(nbytes)
    speeds = {}
    for name, fn in {
        "crc32": lambda: zlib.crc32(data),
        "xxh3_64": lambda: __import__("xxhash").xxh3_64(data).intdigest(),
        "adler32": lambda: zlib.adler32(data),
        "blake2b": lambda: hashlib.blake2b(data).digest(),
        "sha1": lambda: hashlib.sha1(data).digest(),
    }.items():
        speeds[name] = nbytes / 2**20 / _median_time(fn, 3)
    return speeds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=400)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", default="/tmp/bench_ckpt")
    args = parser.parse_args()

    from safetensors.torch import load_file, save_file

    from accelerando import Accelerator

    for name, speed in checksum_speed().items():
        print(f"checksum {name:8s} {speed:8.0f} MB/s")
    model, optimizer = build(args.size_mb)
    accelerator = Accelerator(cpu=True)
    model, optimizer = accelerator.prepare(model, optimizer)
    state = accelerator.unwrap_model(model).state_dict()
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    print(f"weights {nbytes / 2**20:.0f} MB, optimizer state ~{2 * nbytes / 2**20:.0f} MB")

    raw_dir = os.path.join(args.dir, "raw")
    ours_dir = os.path.join(args.dir, "ours")
    weights, opt_file = os.path.join(raw_dir, "model.safetensors"), os.path.join(raw_dir, "optimizer.bin")

    def reset() -> None:
        shutil.rmtree(args.dir, ignore_errors=True)
        os.makedirs(raw_dir)

    def raw_write() -> None:
        save_file(state, weights, metadata={"format": "pt"})
        torch.save(optimizer.state_dict(), opt_file)

    def raw_save() -> None:
        raw_write()
        _fsync(weights)
        _fsync(opt_file)

    t_raw_nofsync = _median_time(raw_write, args.repeats, reset)
    t_raw = _median_time(raw_save, args.repeats, reset)
    t_ours = _median_time(lambda: accelerator.save_state(ours_dir), args.repeats, reset)
    reset()
    raw_save()
    accelerator.save_state(ours_dir)

    def raw_load() -> None:
        load_file(weights)
        torch.load(opt_file, weights_only=True)

    t_raw_load = _median_time(raw_load, args.repeats)
    t_load = _median_time(lambda: accelerator.load_state(ours_dir), args.repeats)
    t_load_nock = _median_time(lambda: accelerator.load_state(ours_dir, verify_checksums=False), args.repeats)
    fsync_share = (t_raw - t_raw_nofsync) / t_raw
    print(f"raw save (write only)        {t_raw_nofsync:7.3f} s")
    print(f"raw save (write + fsync)     {t_raw:7.3f} s   fsync share {fsync_share:.0%}")
    print(f"save_state                   {t_ours:7.3f} s   = {t_ours / t_raw:.3f} x raw+fsync")
    print(f"raw load                     {t_raw_load:7.3f} s")
    print(f"load_state (CRC-32 verified) {t_load:7.3f} s   = {t_load / t_raw_load:.3f} x raw")
    print(f"load_state (sizes only)      {t_load_nock:7.3f} s   = {t_load_nock / t_raw_load:.3f} x raw")
    shutil.rmtree(args.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
