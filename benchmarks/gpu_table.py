"""The GPU half of the side-by-side harness: accelerando, the reference and plain PyTorch on one CUDA device.

The same kind of table as ``compare_reference.py`` (columns: medians of alternating rounds, ratios of
those medians, each ratio's per-round spread, goal verdicts), for the figures that mean something on
a GPU: the first ``Accelerator()``; a training epoch with the model on the device (accumulation 1 and
4) and a bf16 one (autocast; raw: ``torch.autocast`` by hand); a prepared dataloader putting batches
on the device (raw: pinned memory, ``non_blocking`` copies); an FSDP2 step on one device (under
``torchrun --nproc_per_node 1``; raw: ``fully_shard`` by hand); and a big-model load to the GPU
(``load_checkpoint_and_dispatch(..., {"": 0})``; raw: meta model + safetensors to ``cuda:0`` +
``assign``). Times are wall seconds with the device synchronised at the end of each measurement.

Run it only on a machine with a CUDA device (never in CI): without one it prints one line and exits
with status 2. ``--rehearse`` runs every group on the CPU at toy sizes instead (gloo for FSDP2): it
checks the script itself before a device is lent, and its figures mean nothing. From a session lent a GPU machine (about 5 minutes on one H200 with the defaults)::

    run(command="PYTHONPATH=src python3 benchmarks/gpu_table.py --markdown $OUT/gpu_table.md", timeout_s=600)

The reference column needs ``accelerate`` importable there; the device machine reaches no registry,
so carry its wheel as ``scripts/device_check.sh`` carries optional ones (``pip download --no-deps
accelerate==1.15.0 -d .whl``, installed with ``--target /tmp/site`` and put on ``PYTHONPATH``).
Without it the reference column is empty and the table says why.

Run: python benchmarks/gpu_table.py [--rounds 3] [--reps 7] [--only first,step,...] [--markdown t.md] [--rehearse]
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from compare_reference import STEP_GOAL, Goal, Row, _alternating, _free_port, table  # noqa: E402

__all__ = ["GROUPS", "main", "parse_args"]

GROUPS = ("first", "step", "bf16", "dataloader", "fsdp2", "big_model")
NO_DEVICE = (
    "gpu_table.py: no CUDA device here (torch.cuda.is_available() is False); "
    "run it on a machine with a GPU (it is never run in CI)"
)


# ---------------------------------------------------------------- child measurements (one process)


def _sync() -> None:
    import torch

    if torch.cuda.is_initialized():  # never in a rehearsal (--device cpu): nothing to wait for
        torch.cuda.synchronize()


def _timed(fn: Callable[[], object]) -> float:
    _sync()
    start = time.perf_counter()
    fn()
    _sync()
    return time.perf_counter() - start


def _interleaved(
    variants: dict[str, Callable[[], object]], reps: int, barrier: Callable[[], None]
) -> dict[str, float]:
    """Median wall seconds of each variant over ``reps`` alternating rounds (one unrecorded round first)."""
    times: dict[str, list[float]] = {name: [] for name in variants}
    for rep in range(reps + 1):
        for name in list(variants) if rep % 2 == 0 else list(variants)[::-1]:
            barrier()
            elapsed = _timed(variants[name])
            if rep:
                times[name].append(elapsed)
    return {name: statistics.median(values) for name, values in times.items()}


def child_first(lib: str, args: argparse.Namespace) -> dict[str, float]:
    """CPU seconds from after ``import torch`` to a constructed ``Accelerator()`` (compare_reference's figure)."""
    from compare_reference import child_first as first

    return first(lib, args)


def _training_setup(lib: str, args: argparse.Namespace, mixed_precision: str):  # type: ignore[no-untyped-def]
    import torch
    from bench_training_step import build
    from torch.utils.data import DataLoader

    torch.manual_seed(0)
    pin = args.device == "cuda"
    acc = importlib.import_module(lib).Accelerator(
        gradient_accumulation_steps=args.accumulation, mixed_precision=mixed_precision, cpu=not pin
    )
    model, data = build(args.width, args.samples)
    raw_model = copy.deepcopy(model).to(acc.device)  # its own copy: bf16 patches the prepared forward
    raw_opt = torch.optim.SGD(raw_model.parameters(), lr=1e-3)
    raw_loader = DataLoader(data, batch_size=64, pin_memory=pin)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    model, opt, loader = acc.prepare(model, opt, DataLoader(data, batch_size=64, pin_memory=pin))
    return acc, (model, opt, loader), (raw_model, raw_opt, raw_loader)


def child_step(lib: str, args: argparse.Namespace) -> dict[str, float]:
    """Median wall seconds of a prepared epoch on the GPU and of the hand-written one (``--precision``)."""
    import torch
    from bench_training_step import prepared_epoch, raw_epoch

    bf16 = args.precision == "bf16"
    acc, prepared, raw = _training_setup(lib, args, args.precision)

    def raw_run() -> None:
        autocast = torch.autocast(args.device, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
        with autocast:
            raw_epoch(*raw, args.accumulation, acc.device)

    medians = _interleaved(
        {"lib": lambda: prepared_epoch(acc, *prepared, args.accumulation), "raw": raw_run},
        args.reps,
        acc.wait_for_everyone,
    )
    return medians


def child_dataloader(lib: str, args: argparse.Namespace) -> dict[str, float]:
    """Median wall seconds of an epoch of a prepared loader putting batches on the GPU, and raw."""
    import torch
    from bench_dataloader import _dataset
    from torch.utils.data import DataLoader

    device, pin = torch.device(args.device, 0), args.device == "cuda"
    prepare_data_loader = importlib.import_module(f"{lib}.data_loader").prepare_data_loader
    dataset = _dataset(args.samples)
    raw = DataLoader(dataset, batch_size=32, shuffle=True, pin_memory=pin)
    prepared = prepare_data_loader(
        DataLoader(dataset, batch_size=32, shuffle=True, pin_memory=pin),
        device=device,
        num_processes=1,
        process_index=0,
        put_on_device=True,
        non_blocking=True,
    )

    def raw_epoch() -> None:
        for x, y in raw:
            x.to(device, non_blocking=True), y.to(device, non_blocking=True)

    def prepared_epoch() -> None:
        for _ in prepared:
            pass

    return _interleaved({"lib": prepared_epoch, "raw": raw_epoch}, args.reps, lambda: None)


def _fsdp_model(width: int):  # type: ignore[no-untyped-def]
    import torch
    from torch import nn

    torch.manual_seed(0)
    return nn.Sequential(
        *[nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(4)], nn.Linear(width, 1)
    )


def _fsdp_epoch(model, opt, batches, backward: Callable[[object], None]) -> None:  # type: ignore[no-untyped-def]
    import torch

    for x, y in batches:
        backward(torch.nn.functional.mse_loss(model(x), y))
        opt.step()
        opt.zero_grad()


def child_fsdp2(lib: str, args: argparse.Namespace) -> dict[str, float]:
    """Median wall seconds of an FSDP2 epoch on one device (under torchrun, 1 process); "raw": ``fully_shard`` by hand.

    The raw figure is a child of its own, so that the reference's and raw columns are measured even
    where a library refuses FSDP on one process (the table then notes its error).
    """
    import torch

    if lib == "raw":
        from torch.distributed.fsdp import fully_shard

        if args.device == "cuda":
            torch.distributed.init_process_group("nccl")
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
            torch.cuda.set_device(device)
        else:
            torch.distributed.init_process_group("gloo")
            device = torch.device("cpu")
        model = _fsdp_model(args.width).to(device)
        for block in model:
            fully_shard(block)
        fully_shard(model)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        backward: Callable[[object], None] = lambda loss: loss.backward()  # noqa: E731
        barrier: Callable[[], None] = lambda: None  # noqa: E731
    else:
        module = importlib.import_module(lib)
        acc = module.Accelerator(
            fsdp_plugin=module.FullyShardedDataParallelPlugin(fsdp_version=2), cpu=args.device == "cpu"
        )
        device, backward, barrier = acc.device, acc.backward, acc.wait_for_everyone
        model = acc.prepare(_fsdp_model(args.width))  # the model first: its optimizer takes the shards
        opt = acc.prepare(torch.optim.AdamW(model.parameters(), lr=1e-4))
    generator = torch.Generator().manual_seed(0)
    batches = [
        (torch.randn(64, args.width, generator=generator), torch.randn(64, 1, generator=generator))
        for _ in range(args.samples // 64)
    ]
    on_device = [(x.to(device), y.to(device)) for x, y in batches]
    return _interleaved({"lib": lambda: _fsdp_epoch(model, opt, on_device, backward)}, args.reps, barrier)


def child_big_model(lib: str, args: argparse.Namespace) -> dict[str, float]:
    """Wall seconds of loading the bench_big_model checkpoint onto the GPU and one forward ("raw": meta + assign)."""
    import bench_big_model
    import torch

    bench_big_model.LAYERS = args.layers
    build_model, target = bench_big_model.build_model, "cuda:0" if args.device == "cuda" else "cpu"
    path = os.path.join(args.workdir, "single", "model.safetensors")
    x = torch.randn(4, bench_big_model.WIDTH, device=target)
    _sync()
    start = time.perf_counter()
    if lib == "raw":
        from safetensors.torch import load_file

        with torch.device("meta"):
            model = build_model()
        model.load_state_dict(load_file(path, device=target), assign=True)
    else:
        module = importlib.import_module(lib)
        with module.init_empty_weights():
            model = build_model()
        model = module.load_checkpoint_and_dispatch(model, path, {"": 0 if args.device == "cuda" else "cpu"})
    with torch.no_grad():
        model(x)
    _sync()
    return {"lib": time.perf_counter() - start}


CHILDREN: dict[str, Callable[[str, argparse.Namespace], dict[str, float]]] = {
    "first": child_first,
    "step": child_step,
    "dataloader": child_dataloader,
    "fsdp2": child_fsdp2,
    "big_model": child_big_model,
}


# ---------------------------------------------------------------- the parent


def run_child(figure: str, lib: str, extra: list[str], torchrun: bool = False) -> dict[str, float]:
    """Run one child measurement in a fresh process (``torchrun``: one process under torchrun)."""
    launcher = [sys.executable]
    if torchrun:
        launcher += [
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            "1",
            "--master_port",
            str(_free_port()),
        ]
    command = [*launcher, __file__, "--child", figure, "--lib", lib, *extra]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"{figure} ({lib}) exited with {done.returncode}: {_cause(done.stderr)}")


def _cause(stderr: str) -> str:
    """The child's exception line (under torchrun its error report ends stderr, not the exception)."""
    lines = [line.removeprefix("[rank0]: ").strip() for line in stderr.splitlines() if line.strip()]
    for line in reversed(lines):
        name = line.split(":", 1)[0]
        if name.endswith(("Error", "Exception")) and not name.endswith("ChildFailedError"):
            return line
    return lines[-1] if lines else "(no output)"


def measure(
    row: Row, figure: str, extra: list[str], rounds: int, libs: tuple[str, ...], raw: str
) -> list[str]:
    """Fill ``row`` from alternating children; ``raw``: "beside" (accelerando's child), "own" (a child) or "".

    A library (or raw) whose child fails is left out of the row's later rounds; the failures are
    returned as notes, one line each.
    """
    names = [*libs, "raw"] if raw == "own" else list(libs)
    torchrun, notes = figure == "fsdp2", []
    for name in list(names):  # one unrecorded round each: bytecode, file cache, CUDA context
        try:
            run_child(figure, name, extra, torchrun)
        except RuntimeError as error:
            names.remove(name)
            notes.append(f"- {row.label}: {error}")
    for _, name in _alternating(rounds, names):
        result = run_child(figure, name, extra, torchrun)
        column = {"accelerando": "acc", "accelerate": "ref", "raw": "raw"}[name]
        row.samples[column].append(result["lib"])
        if name == "accelerando" and raw == "beside":
            row.samples["raw"].append(result["raw"])
    return notes


def _plan(args: argparse.Namespace) -> Iterator[tuple[Row, str, list[str], str]]:
    """(row, child figure, child arguments, where raw comes from) for each selected group."""
    device = ["--device", args.device]
    reps = ["--reps", str(args.reps), "--samples", str(args.samples), *device]
    for group in args.only.split(",") if args.only else GROUPS:
        if group == "first":
            yield (
                Row("first `Accelerator()` after `import torch`, CUDA machine (CPU s)", Goal("acc/ref", 0.5)),
                "first",
                device,
                "",
            )
        elif group in ("step", "bf16"):
            precision = "bf16" if group == "bf16" else "no"
            for accumulation in (1, 4) if group == "step" else (1,):
                label = f"GPU training epoch, {args.width} wide, {precision} precision, accumulation {accumulation} (s)"
                extra = [
                    *reps,
                    "--width",
                    str(args.width),
                    "--accumulation",
                    str(accumulation),
                    "--precision",
                    precision,
                ]
                yield Row(label, STEP_GOAL), "step", extra, "beside"
        elif group == "dataloader":
            label = f"dataloader epoch to the GPU, {args.samples * 8} samples, batch 32 (s; raw: pinned, non_blocking)"
            yield (
                Row(label, STEP_GOAL),
                "dataloader",
                ["--samples", str(args.samples * 8), "--reps", str(args.reps), *device],
                "beside",
            )
        elif group == "fsdp2":
            label = f"FSDP2 epoch on 1 device, {args.width} wide, AdamW (s; raw: fully_shard by hand)"
            yield Row(label, STEP_GOAL), "fsdp2", [*reps, "--width", str(args.width)], "own"
        elif group == "big_model":
            gibibytes = args.layers * 2048 * 2049 * 4 / 2**30
            label = f"big-model load {gibibytes:.2f} GiB to the GPU + forward (s; raw: meta + safetensors to cuda + assign)"
            extra = ["--workdir", args.workdir, "--layers", str(args.layers), *device]
            yield Row(label), "big_model", extra, "own"
        else:
            raise SystemExit(f"gpu_table.py: unknown group {group!r}; choose among {','.join(GROUPS)}")


def build_rows(args: argparse.Namespace, libs: tuple[str, ...]) -> tuple[list[Row], list[str]]:
    """Measure every selected group; a row whose child fails keeps what it has and adds a note."""
    rows: list[Row] = []
    notes: list[str] = []
    for row, figure, extra, raw in _plan(args):
        if figure == "big_model":
            import bench_big_model

            bench_big_model.LAYERS = args.layers
            os.makedirs(args.workdir, exist_ok=True)
            bench_big_model.prepare(args.workdir)
        print(f"measuring {row.label} ...", file=sys.stderr, flush=True)
        rows.append(row)
        try:
            notes += measure(row, figure, extra, args.rounds, libs, raw)
        except RuntimeError as error:
            notes.append(f"- {row.label}: {error}")
    return rows, notes


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options (``--quick``: small sizes and 2 rounds, a smoke run)."""
    parser = argparse.ArgumentParser(prog="gpu_table.py", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds per figure")
    parser.add_argument("--reps", type=int, default=7, help="epochs per child measurement")
    parser.add_argument("--samples", type=int, default=64 * 100, help="samples per training epoch")
    parser.add_argument("--width", type=int, default=1024, help="width of the trained MLPs")
    parser.add_argument("--quick", action="store_true", help="small sizes and 2 rounds: a smoke run")
    parser.add_argument("--only", help=f"comma-separated groups among {','.join(GROUPS)}")
    parser.add_argument("--markdown", help="also write the table to this file")
    parser.add_argument(
        "--workdir", default="/tmp/bench_big_model", help="where the big checkpoint is written"
    )
    parser.add_argument(
        "--rehearse",
        action="store_true",
        help="run every group on the CPU at toy sizes: checks the script before a GPU is lent (figures mean nothing)",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help=argparse.SUPPRESS)
    parser.add_argument("--layers", type=int, default=90, help=argparse.SUPPRESS)
    parser.add_argument("--lib", help=argparse.SUPPRESS)
    parser.add_argument("--accumulation", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--precision", default="no", choices=("no", "bf16"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    unknown = [g for g in (args.only or "").split(",") if g and g not in GROUPS]
    if unknown:
        parser.error(f"unknown group(s) {','.join(unknown)} in --only; choose among {','.join(GROUPS)}")
    if args.rounds < 1 or args.reps < 1:
        parser.error("--rounds and --reps must be at least 1")
    if args.quick:
        args.rounds, args.reps, args.samples = min(args.rounds, 2), min(args.reps, 3), 64 * 20
    if args.rehearse:
        args.device, args.rounds, args.reps = "cpu", 1, 1
        args.samples, args.width, args.layers = 64 * 2, 32, 2
        args.workdir += "_rehearsal"  # never the real checkpoint's folder: its model has other layers
    return args


def main(argv: list[str] | None = None) -> int:
    """Measure and print the table; 2 (one line on stderr) without a CUDA device."""
    args = parse_args(argv)
    import torch

    on_cuda = args.device == "cuda"
    if on_cuda and not torch.cuda.is_available():
        print(NO_DEVICE, file=sys.stderr)
        return 2
    if args.child:
        result = CHILDREN[args.child](args.lib, args)
        if int(os.environ.get("RANK", "0")) == 0:
            print("RESULT " + json.dumps(result), flush=True)
        return 0
    libs = ("accelerando", "accelerate") if importlib.util.find_spec("accelerate") else ("accelerando",)
    before = os.getloadavg()
    rows, notes = build_rows(args, libs)
    after = os.getloadavg()
    machine = torch.cuda.get_device_name(0) if on_cuda else "REHEARSAL on the CPU (figures mean nothing)"
    header = (
        f"{machine}, torch {torch.__version__}; {os.cpu_count()} CPUs, load average"
        f" {before[0]:.1f} before, {after[0]:.1f} after; {args.rounds} alternating rounds; each column the"
        " median of its rounds, each ratio the ratio of those medians, 'rounds' its min-max round by round"
    )
    if len(libs) == 1:
        notes.insert(0, "- the reference (accelerate) is not importable here: its column is empty")
    text = f"{header}\n\n{table(rows)}\n" + ("\n" + "\n".join(notes) + "\n" if notes else "")
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
