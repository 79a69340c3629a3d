"""Side-by-side figures of accelerando and the reference (Hugging Face Accelerate) in one run.

Every figure is measured for both libraries (and for plain PyTorch, "raw", where it has a
counterpart) in rounds whose order alternates, so that the drift of a shared machine hits them alike;
the table gives medians and ratios measured in this one run. Most figures run in a fresh process per
library and round (``--child``), the checkpoint figures in one process holding both libraries (so
that both write through the same page cache, interleaved).

Figures: first ``Accelerator()`` after ``import torch`` (CPU time); training epoch of a 3-layer MLP
512 / 32 ("tiny") wide, accumulation 1 and 4 (CPU time, 1 thread); the same on 2 DDP processes;
prepared dataloader iteration; launch of 1 and 2 processes to the script's first line; ``save_state``
/ ``load_state`` of a ~400 MB model + AdamW against raw safetensors + ``torch.save`` (with and without
one fsync per file: the durable floor); big-model load (``load_checkpoint_and_dispatch``); device-map
inference (``infer_auto_device_map``).

Run: python benchmarks/compare_reference.py [--rounds 5] [--quick] [--only step,launch,...]
     [--markdown table.md]
"""

from __future__ import annotations

import argparse
import copy
import functools
import importlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

__all__ = ["main"]

LIBS = ("accelerando", "accelerate")
GROUPS = ("first", "step", "ddp", "dataloader", "launch", "checkpoint", "big_model")


@dataclass(frozen=True)
class Goal:
    """What a row must reach: ``ratio`` ("acc/raw" or "acc/ref") at most ``bound`` (seconds over raw for launches)."""

    ratio: str
    bound: float
    seconds: bool = False

    def __str__(self) -> str:
        return f"{self.ratio} <= {self.bound:+.2f} s" if self.seconds else f"{self.ratio} <= {self.bound:g}"


@dataclass
class Row:
    """One figure: per-round samples of each column, index-aligned (sample i of every column is round i).

    ``raw`` holds the raw figure measured beside accelerando (in the same child or the same round), so
    that acc/raw pairs measurements taken together. ``difference``: launches report seconds over raw.
    """

    label: str
    goal: Goal | None = None
    difference: bool = False
    samples: dict[str, list[float]] = field(default_factory=lambda: {"acc": [], "ref": [], "raw": []})

    def cell(self, column: str) -> float | None:
        """Median of one column, None when it has no sample."""
        values = self.samples[column]
        return statistics.median(values) if values else None

    def of_medians(self, other: str) -> float | None:
        """accelerando's median over ``other``'s median (minus it, for a difference row)."""
        acc, base = self.cell("acc"), self.cell(other)
        if acc is None or not base:
            return None
        return acc - base if self.difference and other == "raw" else acc / base

    def per_round(self, other: str) -> list[float]:
        """accelerando over ``other`` in each round (minus it, for a difference row)."""
        pairs = zip(self.samples["acc"], self.samples[other], strict=False)
        if self.difference and other == "raw":
            return [a - b for a, b in pairs]
        return [a / b for a, b in pairs if b]

    def verdict(self) -> str:
        """The goal and whether the ratio of medians meets it; '~' when the rounds' spread crosses it."""
        if self.goal is None:
            return "-"
        value, rounds = (
            self.of_medians(self.goal.ratio.split("/")[1]),
            self.per_round(self.goal.ratio.split("/")[1]),
        )
        if value is None:
            return f"{self.goal}: not measured"
        mark = "met" if value <= self.goal.bound else "MISSED"
        if rounds and min(rounds) <= self.goal.bound < max(rounds):
            mark += " (spread crosses the goal)"
        return f"{self.goal}: {mark}"


# Nothing in the training step or the dataloader loop may cost more than the raw loop beyond noise.
STEP_GOAL = Goal("acc/raw", 1.02)
# Epochs per child. A 2-process DDP epoch of the tiny model lasts 17-25 ms and shares the 2 cores
# with the other rank and gloo's threads: with 11 epochs a round's median swung enough that the
# median of 7 rounds read 1.035-1.055 in one run and 1.00-1.02 in the next (same code); 31 epochs
# cost about 5 minutes more per run of the group.
REPS, DDP_REPS = 11, 31

# ---------------------------------------------------------------- child measurements (one process)


def _accelerator_class(lib: str) -> type:
    return importlib.import_module(lib).Accelerator


def child_first(lib: str, _: argparse.Namespace) -> dict[str, float]:
    """CPU seconds from after ``import torch`` to a constructed ``Accelerator()`` (fresh process)."""
    import torch  # noqa: F401  (the baseline: the user's script has imported torch)

    try:  # another benchmark owns this figure's definition; use it when present
        from bench_first_accelerator import measure_first_accelerator  # type: ignore[import-not-found]

        return {"lib": measure_first_accelerator(lib)}
    except ImportError:
        pass
    start = time.process_time()
    _accelerator_class(lib)()
    return {"lib": time.process_time() - start}


def child_step(lib: str, args: argparse.Namespace) -> dict[str, float]:
    """Median main-thread CPU seconds of a prepared epoch and of the raw epoch, interleaved in this process.

    The main thread's time, not the process's: the library's per-step code runs there, while gloo's
    own threads (the same collectives in both loops) spend CPU waiting for the other process in
    amounts that swing 15% from one launch to the next. Should any other Python thread run during
    the epochs (a library's helper), the process's time is used instead, so that its work is counted.
    """
    import torch
    from bench_training_step import build, prepared_epoch, raw_epoch
    from torch.utils.data import DataLoader, Subset

    torch.set_num_threads(1)
    accumulation, width = args.accumulation, args.width
    # cpu=True: under torchrun on a machine without GPUs the reference otherwise runs two independent
    # one-process copies (no DDP at all); with it, both libraries form one 2-process gloo job.
    acc = _accelerator_class(lib)(gradient_accumulation_steps=accumulation, cpu=True)
    if acc.num_processes != int(os.environ.get("WORLD_SIZE", "1")):
        raise RuntimeError(
            f"{lib} formed a {acc.num_processes}-process job under a {os.environ['WORLD_SIZE']}-process launch"
        )
    world, rank = acc.num_processes, acc.process_index
    model, data = build(width, args.samples)
    # One process: both loops train the very same module (prepare returns it unchanged), so the
    # comparison cannot be skewed by where two copies of the weights happen to sit in memory. Several:
    # the copy goes to raw DDP in even rounds and to the prepared model in odd ones, so that where
    # each copy sits in memory favours neither side over a run.
    raw_model = model
    if world > 1:
        from torch.nn.parallel import DistributedDataParallel

        raw_model = copy.deepcopy(model)
        if args.round % 2:
            model, raw_model = raw_model, model
        raw_model = DistributedDataParallel(raw_model)
        indices = [i for b in range(rank, args.samples // 64, world) for i in range(b * 64, b * 64 + 64)]
        raw_loader = DataLoader(Subset(data, indices), batch_size=64)
    else:
        raw_loader = DataLoader(data, batch_size=64)
    raw_opt = torch.optim.SGD(raw_model.parameters(), lr=1e-3)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    model, opt, loader = acc.prepare(model, opt, DataLoader(data, batch_size=64))
    times: dict[str, list[float]] = {"lib": [], "raw": []}
    process_times: dict[str, list[float]] = {"lib": [], "raw": []}
    other_threads = False
    for rep in range(args.reps + 1):  # the first round warms up and is dropped
        for name in ("raw", "lib") if rep % 2 == 0 else ("lib", "raw"):
            acc.wait_for_everyone()
            start, process_start = time.thread_time(), time.process_time()
            if name == "raw":
                raw_epoch(raw_model, raw_opt, raw_loader, accumulation)
            else:
                prepared_epoch(acc, model, opt, loader, accumulation)
            if rep:
                times[name].append(time.thread_time() - start)
                process_times[name].append(time.process_time() - process_start)
            other_threads = other_threads or threading.active_count() > 1
    if other_threads:
        times = process_times
    result = {name: statistics.median(values) for name, values in times.items()}
    return result


def child_dataloader(lib: str, args: argparse.Namespace) -> dict[str, float]:
    """Median CPU seconds of a prepared loader's epoch and the raw loader's (interleaved)."""
    import torch
    from bench_dataloader import _compare, _dataset
    from torch.utils.data import DataLoader

    torch.set_num_threads(1)
    prepare_data_loader = importlib.import_module(f"{lib}.data_loader").prepare_data_loader
    dataset = _dataset(args.samples)
    raw = DataLoader(dataset, batch_size=32, shuffle=True)
    prepared = prepare_data_loader(
        DataLoader(dataset, batch_size=32, shuffle=True),
        num_processes=1,
        process_index=0,
        put_on_device=True,
        device=torch.device("cpu"),
    )
    result = _compare(raw, prepared, args.reps, len(raw))
    return {"lib": result["prepared_s"], "raw": result["raw_s"]}


def child_big_model(lib: str, args: argparse.Namespace) -> dict[str, float]:
    """Wall seconds of loading the bench_big_model checkpoint and one forward ("raw": meta + assign)."""
    import bench_big_model

    result = (
        bench_big_model.run_loading("floor_single", args.workdir)["seconds"]
        if lib == "raw"
        else _load(lib, args)
    )
    return {"lib": result}


def _load(lib: str, args: argparse.Namespace) -> float:
    import torch
    from bench_big_model import WIDTH, build_model

    module = importlib.import_module(lib)
    x = torch.randn(4, WIDTH)
    start = time.perf_counter()
    with module.init_empty_weights():
        model = build_model()
    path = os.path.join(args.workdir, "single", "model.safetensors")
    model = module.load_checkpoint_and_dispatch(model, path, {"": "cpu"})
    with torch.no_grad():
        model(x)
    return time.perf_counter() - start


def child_device_map(lib: str, args: argparse.Namespace) -> dict[str, float]:
    """CPU seconds of ``infer_auto_device_map`` on a meta model of ``--modules`` Linear layers."""
    import torch

    infer = importlib.import_module(lib).infer_auto_device_map
    with torch.device("meta"):
        model = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(args.modules)])
    size = args.modules * (256 * 256 + 256) * 4
    start = time.process_time()
    infer(model, {"cpu": size // 2, "disk": "1000GB"})
    return {"lib": time.process_time() - start}


CHILDREN: dict[str, Callable[[str, argparse.Namespace], dict[str, float]]] = {
    "first": child_first,
    "step": child_step,
    "dataloader": child_dataloader,
    "big_model": child_big_model,
    "device_map": child_device_map,
}


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@functools.cache
def _bytecode_folder() -> str:
    return tempfile.mkdtemp(prefix="compare_reference_pyc_")


def run_child(figure: str, lib: str, extra: list[str], processes: int = 1) -> dict[str, float]:
    """Run one child measurement in a fresh process (``processes`` > 1: under torchrun)."""
    if processes > 1:
        launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(processes)]
        # A free port chosen here: with --master_port 0 the processes' own process-group start waited
        # for a store on port 0 and hung (seen with torchrun 2.13 on this machine).
        launcher += ["--master_port", str(_free_port())]
    else:
        launcher = [sys.executable]
    command = [*launcher, __file__, "--child", figure, "--lib", lib, *extra]
    # Bytecode is written and read under a private folder for both libraries: with the session's
    # PYTHONDONTWRITEBYTECODE every child would recompile each module, which is not what users see.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env |= {"OMP_NUM_THREADS": "1", "PYTHONPYCACHEPREFIX": _bytecode_folder()}
    done = subprocess.run(command, capture_output=True, text=True, check=False, env=env)
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"{figure} ({lib}) failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")


# ---------------------------------------------------------------- figures measured by the parent


def _alternating(rounds: int, names: list[str]) -> list[tuple[int, str]]:
    order = []
    for i in range(rounds):
        order += [(i, name) for name in (names if i % 2 == 0 else names[::-1])]
    return order


def measure_children(rows: list[Row], figure: str, extra: list[str], rounds: int, raw: bool,
                     processes: int = 1) -> None:  # fmt: skip
    """Fill ``rows[0]`` from alternating fresh-process children of each library (and raw)."""
    row = rows[0]
    names = [*LIBS, "raw"] if raw and figure == "big_model" else list(LIBS)
    for name in names:  # one unrecorded round each: fills the bytecode folder, warms the file cache
        run_child(figure, name, extra, processes)
    for index, name in _alternating(rounds, names):
        result = run_child(figure, name, [*extra, "--round", str(index)], processes)
        column = {"accelerando": "acc", "accelerate": "ref", "raw": "raw"}[name]
        row.samples[column].append(result["lib"])
        if name == "accelerando" and "raw" in result:  # the raw epoch measured beside accelerando's
            row.samples["raw"].append(result["raw"])


def measure_launch(rows: list[Row], processes: int, rounds: int) -> None:
    """Seconds from the command's start to the script's first line: python/torchrun, both launchers."""
    from bench_cli import FIRST_LINE, _exe, _first_line_delay

    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE", "ACCELERANDO"))}
    with tempfile.TemporaryDirectory() as tmp:
        env["XDG_CACHE_HOME"] = env["HF_HOME"] = tmp  # no config file of either library: defaults
        script, out = Path(tmp) / "first_line.py", Path(tmp) / "out"
        script.write_text(FIRST_LINE)
        out.mkdir()
        tail = [str(script), str(out)]
        if processes == 1:
            commands = {
                "raw": [sys.executable, *tail],
                "acc": [*_exe("accelerando", "accelerando.commands.cli"), "launch", "--num_processes", "1", *tail],
                "ref": [*_exe("accelerate", "accelerate.commands.accelerate_cli"), "launch", "--num_processes", "1", *tail],
            }  # fmt: skip
        else:
            commands = {
                "raw": [*_exe("torchrun", "torch.distributed.run"), "--nproc_per_node", "2", "--master_port", "0", *tail],
                "acc": [*_exe("accelerando", "accelerando.commands.cli"), "launch", "--cpu", "--num_processes", "2", *tail],
                # The reference runs several CPU processes only through its multi-GPU (torchrun) path.
                "ref": [*_exe("accelerate", "accelerate.commands.accelerate_cli"), "launch", "--multi_gpu",
                        "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no",
                        "--dynamo_backend", "no", *tail],
            }  # fmt: skip
        for _, column in _alternating(rounds, list(commands)):
            rows[0].samples[column].append(_first_line_delay(commands[column], out, env, column))


def measure_checkpoint(rows: list[Row], args: argparse.Namespace) -> None:
    """save_state / load_state of both libraries and raw files, interleaved in one child process."""
    result = run_child(
        "checkpoint",
        "accelerando",
        [
            "--size-mb",
            str(args.size_mb),
            "--reps",
            str(args.rounds),
            *(["--back-to-back"] if args.back_to_back else []),
        ],
    )
    result |= run_child("small_save", "accelerando", ["--reps", str(args.rounds)])
    save, scratch, load, small, small_scratch = rows
    save.samples = {"acc": result["acc_save"], "ref": result["ref_save"], "raw": result["raw_fsync"]}
    scratch.samples = {"acc": result["acc_scratch"], "ref": result["ref_save"], "raw": result["raw_write"]}
    load.samples = {"acc": result["acc_load"], "ref": result["ref_load"], "raw": result["raw_load"]}
    small.samples = {"acc": result["acc_small"], "ref": result["ref_small"], "raw": []}
    small_scratch.samples = {"acc": result["acc_small_scratch"], "ref": result["ref_small"], "raw": []}


def child_checkpoint(_: str, args: argparse.Namespace) -> dict[str, list[float]]:
    """Each save/load variant once per round, in alternating order; lists of seconds per variant."""
    import torch
    from bench_checkpoint import _fsync, build
    from safetensors.torch import load_file, save_file

    from accelerando.core.settings.fields import FIELDS_BY_NAME

    model, optimizer = build(args.size_mb)
    ours = _accelerator_class("accelerando")(cpu=True)
    ours_model, ours_opt = ours.prepare(model, optimizer)
    ref = _accelerator_class("accelerate")(cpu=True)
    ref.prepare(model, optimizer)
    folder = tempfile.mkdtemp(prefix="compare_ckpt_", dir=args.dir)
    weights, opt_file = os.path.join(folder, "model.safetensors"), os.path.join(folder, "optimizer.bin")

    def raw_write() -> None:
        save_file(model.state_dict(), weights, metadata={"format": "pt"})
        torch.save(optimizer.state_dict(), opt_file)

    def raw_fsync() -> None:
        raw_write()
        _fsync(weights)
        _fsync(opt_file)

    def raw_load() -> None:
        model.load_state_dict(load_file(weights))
        optimizer.load_state_dict(torch.load(opt_file, weights_only=True))

    # Before the scratch mode existed (the "before" table), its row repeats the durable save.
    scratch_kwargs = {"durable": False} if "checkpoint_durable" in FIELDS_BY_NAME else {}
    saves = {
        "raw_write": raw_write,
        "raw_fsync": raw_fsync,
        "acc_save": lambda: ours.save_state(os.path.join(folder, "acc")),
        "acc_scratch": lambda: ours.save_state(os.path.join(folder, "acc_scratch"), **scratch_kwargs),
        "ref_save": lambda: ref.save_state(os.path.join(folder, "ref")),
    }
    loads = {
        "raw_load": raw_load,
        "acc_load": lambda: ours.load_state(os.path.join(folder, "acc")),
        "ref_load": lambda: ref.load_state(os.path.join(folder, "ref")),
    }
    times: dict[str, list[float]] = {name: [] for name in [*saves, *loads]}
    for variants in (saves, loads):
        if variants is loads:
            os.sync()  # the scratch saves' dirty pages are written back now, not during the loads
            for load in loads.values():  # one unrecorded load each: lazy imports, first page mappings
                load()
        for _, name in _alternating(args.reps, list(variants)):
            if not args.back_to_back and variants is saves:
                os.sync()  # untimed: no other variant's dirty pages are being written back during this one
            start = time.perf_counter()
            variants[name]()
            times[name].append(time.perf_counter() - start)
    shutil.rmtree(folder, ignore_errors=True)
    return times


def child_small_save(_: str, args: argparse.Namespace) -> dict[str, list[float]]:
    """Mean milliseconds of one ``save_state`` of a 4x2 model + SGD (fixed costs), per round, both libraries."""
    import torch

    from accelerando.core.settings.fields import FIELDS_BY_NAME

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    ours = _accelerator_class("accelerando")(cpu=True)
    ours.prepare(model, optimizer)
    ref = _accelerator_class("accelerate")(cpu=True)
    ref.prepare(model, optimizer)
    folder = tempfile.mkdtemp(prefix="compare_small_", dir=args.dir)
    scratch_kwargs = {"durable": False} if "checkpoint_durable" in FIELDS_BY_NAME else {}
    saves = {
        "acc_small": lambda: ours.save_state(os.path.join(folder, "acc")),
        "acc_small_scratch": lambda: ours.save_state(os.path.join(folder, "acc_scratch"), **scratch_kwargs),
        "ref_small": lambda: ref.save_state(os.path.join(folder, "ref")),
    }
    for save in saves.values():  # one unrecorded save each: lazy imports, the folders exist
        save()
    # Untimed: the gigabytes the previous child left dirty are written back now, not while these
    # saves' few fsyncs wait behind them (the reference's saves, which never flush, would not wait).
    os.sync()
    times: dict[str, list[float]] = {name: [] for name in saves}
    per_sample = 20
    for _, name in _alternating(args.reps, list(saves)):
        start = time.perf_counter()
        for _ in range(per_sample):
            saves[name]()
        times[name].append((time.perf_counter() - start) / per_sample * 1e3)  # ms: 3 decimals show it
    shutil.rmtree(folder, ignore_errors=True)
    return times


CHILDREN["checkpoint"] = child_checkpoint  # type: ignore[assignment]
CHILDREN["small_save"] = child_small_save  # type: ignore[assignment]


# ---------------------------------------------------------------- the table


def child_epochs(args: argparse.Namespace, processes: int) -> int:
    """Epochs a training or dataloader child measures: ``--reps``, else the default for its process count."""
    return args.reps or (DDP_REPS if processes > 1 else REPS)


def build_rows(args: argparse.Namespace) -> list[Row]:
    """Measure the selected groups; one Row per figure."""
    rows: list[Row] = []
    groups = args.only.split(",") if args.only else GROUPS
    step_extra = ["--samples", str(args.samples)]
    for group in groups:
        if rows:  # the figures so far, in case a long run is stopped
            print(table(rows), file=sys.stderr, flush=True)
        print(f"measuring {group} ...", file=sys.stderr, flush=True)
        if group == "first":
            rows.append(Row("first `Accelerator()` after `import torch` (CPU s)", Goal("acc/ref", 0.5)))
            measure_children(rows[-1:], "first", [], args.rounds, raw=False)
        elif group in ("step", "ddp"):
            processes = 2 if group == "ddp" else 1
            for width in (512, 32):
                for accumulation in (1, 4) if group == "step" or width == 32 else (1,):
                    name = f"{'2-process DDP' if processes > 1 else 'training'} epoch, {width} wide, accumulation {accumulation} (main-thread CPU s)"
                    rows.append(Row(name, STEP_GOAL))
                    shape = ["--width", str(width), "--accumulation", str(accumulation)]
                    extra = [*step_extra, "--reps", str(child_epochs(args, processes)), *shape]
                    measure_children(rows[-1:], "step", extra, args.rounds, raw=True, processes=processes)
        elif group == "dataloader":
            rows.append(Row(f"dataloader epoch, {args.samples * 8} samples, batch 32 (CPU s)", STEP_GOAL))
            extra = ["--samples", str(args.samples * 8), "--reps", str(child_epochs(args, 1))]
            measure_children(rows[-1:], "dataloader", extra, args.rounds, raw=True)
        elif group == "launch":
            for processes in (1, 2):
                base = "python" if processes == 1 else "torchrun"
                goal = Goal("acc/raw", 0.15 if processes == 1 else 0.10, seconds=True)
                label = f"launch {processes} process(es) to first line (s; acc/raw: +s over {base})"
                rows.append(Row(label, goal, difference=True))
                measure_launch(rows[-1:], processes, args.rounds)
        elif group == "checkpoint":
            rows += [
                Row(
                    f"`save_state` {args.size_mb} MB + AdamW (raw: + fsync, the durable floor)",
                    Goal("acc/raw", 1.05),
                ),
                Row("`save_state` scratch (durable=False; raw: no fsync)", Goal("acc/ref", 1.05)),
                Row("`load_state` (raw: safetensors + torch.load + load_state_dict)", Goal("acc/raw", 1.0)),
                Row("`save_state` of a 4x2 model + SGD, durable (ms per save)", Goal("acc/ref", 2.0)),
                Row("`save_state` of a 4x2 model + SGD, durable=False (ms per save)", Goal("acc/ref", 1.2)),
            ]
            measure_checkpoint(rows[-5:], args)
        elif group == "big_model":
            import bench_big_model

            os.makedirs(args.workdir, exist_ok=True)
            bench_big_model.prepare(args.workdir)
            rows.append(Row("big-model load 1.44 GB + forward (raw: meta + assign)"))
            measure_children(rows[-1:], "big_model", ["--workdir", args.workdir], args.rounds, raw=True)
            rows.append(Row(f"`infer_auto_device_map`, {args.modules} modules, cpu+disk (CPU s)"))
            measure_children(
                rows[-1:], "device_map", ["--modules", str(args.modules)], max(1, args.rounds // 2), raw=False
            )
    return rows


def _fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _spread(values: list[float], difference: bool = False) -> str:
    if not values:
        return "-"
    if difference:
        return f"{min(values):+.3f} to {max(values):+.3f} s"
    return f"{min(values):.3f}-{max(values):.3f}"


def table(rows: list[Row]) -> str:
    """The markdown table: each column's median, ratios of those medians, each ratio's per-round spread, goal.

    A ratio column is the ratio of the medians printed on its row (for launches: the difference of
    the medians), so a reader can check it; the spread beside it is the min-max of the same ratio
    taken round by round.
    """
    lines = [
        "| figure | accelerando | reference | raw | acc/raw | acc/raw rounds | acc/ref | acc/ref rounds | goal |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        over_raw, over_ref = row.of_medians("raw"), row.of_medians("ref")
        ratio_raw = (
            "-" if over_raw is None else (f"{over_raw:+.3f} s" if row.difference else f"{over_raw:.3f}")
        )
        cells = [
            row.label, _fmt(row.cell("acc")), _fmt(row.cell("ref")), _fmt(row.cell("raw")),
            ratio_raw, _spread(row.per_round("raw"), row.difference),
            _fmt(over_ref), _spread(row.per_round("ref")), row.verdict(),
        ]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options; ``--quick`` shrinks every size and count for a smoke run."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds per figure")
    parser.add_argument(
        "--reps",
        type=int,
        help=f"epochs per child measurement (default {REPS}; {DDP_REPS} for the 2-process DDP rows)",
    )
    parser.add_argument("--samples", type=int, default=64 * 60, help="samples per training epoch")
    parser.add_argument("--size-mb", type=int, default=400, help="checkpoint model size")
    parser.add_argument("--modules", type=int, default=2000, help="modules for infer_auto_device_map")
    parser.add_argument("--quick", action="store_true", help="small sizes and 3 rounds: a smoke run")
    parser.add_argument("--only", help=f"comma-separated groups among {','.join(GROUPS)}")
    parser.add_argument("--markdown", help="also write the table to this file")
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="where checkpoints are written")
    parser.add_argument(
        "--back-to-back",
        action="store_true",
        help="checkpoint saves one right after the other; by default os.sync() (untimed) runs before each "
        "timed save, so none pays for the write-back of the previous variants' gigabytes (as a save "
        "between training steps, minutes after the last one)",
    )
    # --settle: the default since 2026-12-05, still accepted
    parser.add_argument("--settle", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--workdir", default="/tmp/bench_big_model")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--lib", help=argparse.SUPPRESS)
    parser.add_argument("--width", type=int, default=512, help=argparse.SUPPRESS)
    parser.add_argument("--accumulation", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--round", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.reps, args.samples = min(args.rounds, 3), min(args.reps or 5, 5), 64 * 20
        args.size_mb, args.modules = min(args.size_mb, 100), min(args.modules, 500)
    return args


def main() -> None:
    """Measure and print the table (and write it as markdown with ``--markdown``)."""
    args = parse_args()
    if args.child:
        result = CHILDREN[args.child](args.lib, args)
        if int(os.environ.get("RANK", "0")) == 0:
            print("RESULT " + json.dumps(result), flush=True)
        return
    before = os.getloadavg()
    rows = build_rows(args)
    after = os.getloadavg()
    header = (
        f"{os.cpu_count()} CPUs; load average (1/5/15 min) {before[0]:.1f} / {before[1]:.1f} / {before[2]:.1f}"
        f" before, {after[0]:.1f} / {after[1]:.1f} / {after[2]:.1f} after; {args.rounds} alternating rounds;"
        " each column is the median of its rounds, each ratio the ratio of those medians, 'rounds' the"
        " min-max of the same ratio round by round"
        + ("; checkpoint saves back to back" if args.back_to_back else "")
        + (
            "; each timed checkpoint save after an untimed os.sync()"
            if "checkpoint" in (args.only or ",".join(GROUPS)) and not args.back_to_back
            else ""
        )
    )
    text = f"{header}\n\n{table(rows)}\n"
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text)


if __name__ == "__main__":
    main()
