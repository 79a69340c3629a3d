"""Benchmark: ``Accelerator.save_state`` / ``load_state`` against raw safetensors + ``torch.save``.

Model: ~400 MB of fp32 weights plus AdamW state (2 x 400 MB). Raw save = ``safetensors.save_file``
of the weights and ``torch.save`` of the optimizer state, then ``fsync`` of both files (the fsync
share is reported). Raw load = ``safetensors.load_file`` + ``torch.load(weights_only=True)``.
"Raw load + load_state_dict" also puts the tensors into the model and optimizer, as ``load_state``
does. Every figure is the median of ``--repeats`` runs (variants interleaved), warm page cache.

Run: python benchmarks/bench_checkpoint.py [--size-mb 400] [--repeats 3] [--dir /tmp/bench_ckpt]
     [--only save|load] [--fresh-processes N] [--counted]

``--counted``: fsync calls, bytes read back (memory-mapped) and CPU seconds of a durable ``save_state``
overwriting its folder against the raw floor, with wall times (also including a trailing ``os.sync()``).
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


def build(size_mb: int, step: bool = True) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """A stack of square linear layers holding ``size_mb`` MB of fp32 weights, after one AdamW step
    (``step=False``: an optimizer without state yet, as in a process that is about to resume)."""
    width = 2048
    layers = max(1, round(size_mb * 2**20 / (4 * (width * width + width))))
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    if step:
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


def interleaved(
    variants: dict[str, Callable[[], None]], repeats: int, before: Callable[[], None] | None
) -> dict:
    """Median seconds of each variant, run in alternating order so that drift in machine load and
    page-cache state hits them alike."""
    times: dict[str, list[float]] = {name: [] for name in variants}
    for i in range(repeats):
        for name in list(variants)[:: 1 if i % 2 == 0 else -1]:
            times[name].append(_median_time(variants[name], 1, before))
    return {name: statistics.median(values) for name, values in times.items()}


def measure(
    accelerator, model, optimizer, folder: str, repeats: int, only: str | None = None
) -> tuple[dict, dict]:
    """Save and load timings of raw safetensors + torch.save against save_state / load_state."""
    from safetensors.torch import load_file, save_file

    state = accelerator.unwrap_model(model).state_dict()
    raw_dir, ours_dir = os.path.join(folder, "raw"), os.path.join(folder, "ours")
    weights, opt_file = os.path.join(raw_dir, "model.safetensors"), os.path.join(raw_dir, "optimizer.bin")

    def reset() -> None:
        shutil.rmtree(folder, ignore_errors=True)
        os.makedirs(raw_dir)

    def raw_write() -> None:
        save_file(state, weights, metadata={"format": "pt"})
        torch.save(optimizer.state_dict(), opt_file)

    def raw_save() -> None:
        raw_write()
        _fsync(weights)
        _fsync(opt_file)

    def raw_load() -> None:
        load_file(weights)
        torch.load(opt_file, weights_only=True)

    def raw_load_apply() -> None:
        accelerator.unwrap_model(model).load_state_dict(load_file(weights))
        optimizer.load_state_dict(torch.load(opt_file, weights_only=True))

    saves = {}
    if only != "load":
        saves = interleaved(
            {"raw_nofsync": raw_write, "raw": raw_save, "ours": lambda: accelerator.save_state(ours_dir)},
            repeats,
            reset,
        )
    reset()
    raw_save()
    accelerator.save_state(ours_dir)
    loads = {}
    if only == "save":
        shutil.rmtree(folder, ignore_errors=True)
        return saves, loads
    loads = interleaved(
        {
            "raw": raw_load,
            "raw_apply": raw_load_apply,
            "ours": lambda: accelerator.load_state(ours_dir),
            "ours_sizes": lambda: accelerator.load_state(ours_dir, verify_checksums=False),
        },
        repeats,
        None,
    )
    shutil.rmtree(folder, ignore_errors=True)
    return saves, loads


def _child_load(variant: str, folder: str, size_mb: int) -> None:
    """In a fresh process (as a resumed run is): time one load into a model and a stateless optimizer."""
    from safetensors.torch import load_file

    from accelerando import Accelerator

    model, optimizer = build(size_mb, step=False)
    accelerator = Accelerator(cpu=True)
    model, optimizer = accelerator.prepare(model, optimizer)
    raw_dir, ours_dir = os.path.join(folder, "raw"), os.path.join(folder, "ours")
    start = time.perf_counter()
    if variant == "raw_apply":
        accelerator.unwrap_model(model).load_state_dict(load_file(os.path.join(raw_dir, "model.safetensors")))
        optimizer.load_state_dict(torch.load(os.path.join(raw_dir, "optimizer.bin"), weights_only=True))
    else:
        accelerator.load_state(ours_dir, verify_checksums=variant == "ours")
    print(time.perf_counter() - start)


def fresh_process_loads(accelerator, model, optimizer, folder: str, rounds: int, size_mb: int) -> dict:
    """Median seconds of one load in each of ``rounds`` fresh processes per variant (alternating)."""
    import subprocess
    import sys

    from safetensors.torch import save_file

    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(os.path.join(folder, "raw"))
    save_file(accelerator.unwrap_model(model).state_dict(), os.path.join(folder, "raw", "model.safetensors"))
    torch.save(optimizer.state_dict(), os.path.join(folder, "raw", "optimizer.bin"))
    accelerator.save_state(os.path.join(folder, "ours"))
    times: dict[str, list[float]] = {"raw_apply": [], "ours": [], "ours_sizes": []}
    for i in range(rounds):
        for variant in list(times)[:: 1 if i % 2 == 0 else -1]:
            command = [
                sys.executable,
                __file__,
                "--child",
                variant,
                "--dir",
                folder,
                "--size-mb",
                str(size_mb),
            ]
            out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
            times[variant].append(float(out.strip().splitlines()[-1]))
    shutil.rmtree(folder, ignore_errors=True)
    return {name: statistics.median(values) for name, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=400)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", default="/tmp/bench_ckpt")
    parser.add_argument("--only", choices=("save", "load"), help="measure only saving or only loading")
    parser.add_argument(
        "--fresh-processes",
        type=int,
        default=0,
        metavar="N",
        help="also time loads in N fresh processes per variant (a resumed run: optimizer without state)",
    )
    parser.add_argument(
        "--counted",
        action="store_true",
        help="count the work of a durable save (fsync calls, bytes read back, CPU) against the raw floor",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child_load(args.child, args.dir, args.size_mb)
        return
    if args.counted:
        report_counted(counted_saves(args.size_mb, args.repeats, args.dir))
        return

    from accelerando import Accelerator

    for name, speed in checksum_speed().items():
        print(f"checksum {name:8s} {speed:8.0f} MB/s")
    model, optimizer = build(args.size_mb)
    accelerator = Accelerator(cpu=True)
    model, optimizer = accelerator.prepare(model, optimizer)
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    print(f"weights {nbytes / 2**20:.0f} MB, optimizer state ~{2 * nbytes / 2**20:.0f} MB")
    saves, loads = measure(accelerator, model, optimizer, args.dir, args.repeats, args.only)
    if saves:
        report_saves(saves)
    if loads:
        report_loads(loads)
    if args.fresh_processes:
        fresh = fresh_process_loads(
            accelerator, model, optimizer, args.dir, args.fresh_processes, args.size_mb
        )
        print(f"fresh process, raw load + load_state_dict   {fresh['raw_apply']:7.3f} s")
        for key, label in (("ours", "load_state (checksums) "), ("ours_sizes", "load_state (sizes only)")):
            print(
                f"fresh process, {label}      {fresh[key]:7.3f} s   = {fresh[key] / fresh['raw_apply']:.3f} x"
            )


class _SaveCounter:
    """Counts ``os.fsync`` calls and bytes memory-mapped (a checksum's read-back) while installed."""

    def __init__(self) -> None:
        import mmap

        self.fsyncs, self.mapped = 0, 0
        self._mmap_module, self._real_fsync, self._real_mmap = mmap, os.fsync, mmap.mmap

    def fsync(self, fd: int) -> None:
        self.fsyncs += 1
        self._real_fsync(fd)

    def mmap(self, fd: int, length: int, *args: object, **kwargs: object) -> object:
        mapped = self._real_mmap(fd, length, *args, **kwargs)
        self.mapped += len(mapped)
        return mapped

    def install(self) -> None:
        os.fsync, self._mmap_module.mmap = self.fsync, self.mmap  # type: ignore[assignment]


def counted_saves(size_mb: int, repeats: int, folder: str) -> dict[str, dict[str, float]]:
    """Raw durable save (safetensors + torch.save + one fsync per file) and ``save_state`` overwriting
    its folder, alternating; per variant the medians of wall and CPU seconds (this process, all threads;
    also wall including an ``os.sync()`` after it, so each pays for its own deletions), fsync calls and
    MB memory-mapped (read back)."""
    import resource

    from safetensors.torch import save_file

    from accelerando import Accelerator

    model, optimizer = build(size_mb)
    accelerator = Accelerator(cpu=True)
    model, optimizer = accelerator.prepare(model, optimizer)
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    weights, opt_file = os.path.join(folder, "model.safetensors"), os.path.join(folder, "optimizer.bin")

    def raw() -> None:
        save_file(model.state_dict(), weights, metadata={"format": "pt"})
        torch.save(optimizer.state_dict(), opt_file)
        _fsync(weights)
        _fsync(opt_file)

    variants = {"raw": raw, "save_state": lambda: accelerator.save_state(os.path.join(folder, "ours"))}
    for variant in variants.values():
        variant()  # the first save of each creates its files; the measured ones overwrite
    counter = _SaveCounter()
    counter.install()
    rows: dict[str, list[dict[str, float]]] = {name: [] for name in variants}
    for i in range(repeats):
        for name in list(variants)[:: 1 if i % 2 == 0 else -1]:
            os.sync()  # start from clean page cache state: no one pays for the previous variant's writeback
            fsyncs, mapped = counter.fsyncs, counter.mapped
            before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
            variants[name]()
            wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF)
            os.sync()
            rows[name].append(
                {
                    "wall": wall,
                    "wall_sync": time.perf_counter() - start,
                    "cpu": after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime,
                    "fsyncs": counter.fsyncs - fsyncs,
                    "mapped_mb": (counter.mapped - mapped) / 2**20,
                }
            )
    shutil.rmtree(folder, ignore_errors=True)
    result = {
        name: {k: statistics.median(r[k] for r in runs) for k in runs[0]} for name, runs in rows.items()
    }
    result["paired"] = {
        k: statistics.median(a[k] / b[k] for a, b in zip(rows["save_state"], rows["raw"], strict=True))
        for k in ("wall", "wall_sync", "cpu")
    }
    return result


def report_counted(result: dict[str, dict[str, float]]) -> None:
    """Print :func:`counted_saves`' table."""
    print(f"{'':12s} {'wall s':>8s} {'+sync s':>8s} {'CPU s':>8s} {'fsyncs':>7s} {'read back MB':>13s}")
    for name in ("raw", "save_state"):
        row = result[name]
        print(
            f"{name:12s} {row['wall']:8.3f} {row['wall_sync']:8.3f} {row['cpu']:8.3f} {row['fsyncs']:7.0f} "
            f"{row['mapped_mb']:13.1f}"
        )
    paired = result["paired"]
    print(
        f"save_state / raw (paired medians): wall {paired['wall']:.3f}, with sync {paired['wall_sync']:.3f}, "
        f"CPU {paired['cpu']:.3f}"
    )


def report_saves(saves: dict) -> None:
    """Print the save timings and their ratio to a raw write + fsync."""
    fsync_share = (saves["raw"] - saves["raw_nofsync"]) / saves["raw"]
    print(f"raw save (write only)        {saves['raw_nofsync']:7.3f} s")
    print(f"raw save (write + fsync)     {saves['raw']:7.3f} s   fsync share {fsync_share:.0%}")
    print(
        f"save_state                   {saves['ours']:7.3f} s   = {saves['ours'] / saves['raw']:.3f} x raw+fsync"
    )


def report_loads(loads: dict) -> None:
    """Print the load timings and their ratios to a raw load (with and without load_state_dict)."""
    print(f"raw load                     {loads['raw']:7.3f} s")
    print(f"raw load + load_state_dict   {loads['raw_apply']:7.3f} s")
    for key, label in (("ours", "load_state (checksums) "), ("ours_sizes", "load_state (sizes only)")):
        ratio, ratio_apply = loads[key] / loads["raw"], loads[key] / loads["raw_apply"]
        print(
            f"{label}      {loads[key]:7.3f} s   = {ratio:.3f} x raw, {ratio_apply:.3f} x raw + load_state_dict"
        )


if __name__ == "__main__":
    main()
