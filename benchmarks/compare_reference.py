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
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

__all__ = ["main"]

LIBS = ("accelerando", "accelerate")
GROUPS = ("first", "step", "ddp", "dataloader", "launch", "checkpoint", "big_model")


@dataclass
class Row:
    """One figure: samples of each column, and paired accelerando/raw ratios."""

    label: str
    unit: str = "s"
    samples: dict[str, list[float]] = field(default_factory=lambda: {"acc": [], "ref": [], "raw": []})
    acc_over_raw: list[float] = field(default_factory=list)

    def cell(self, column: str) -> float | None:
        """Median of one column, None when it has no sample."""
        values = self.samples[column]
        return statistics.median(values) if values else None


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
    """Median CPU seconds of a prepared epoch and of the raw epoch, interleaved in this process."""
    import torch
    from bench_training_step import build, prepared_epoch, raw_epoch
    from torch.utils.data import DataLoader, Subset

    torch.set_num_threads(1)
    accumulation, width = args.accumulation, args.width
    acc = _accelerator_class(lib)(gradient_accumulation_steps=accumulation)
    world, rank = acc.num_processes, acc.process_index
    model, data = build(width, args.samples)
    # One process: both loops train the very same module (prepare returns it unchanged), so the
    # comparison cannot be skewed by where two copies of the weights happen to sit in memory.
    raw_model = model if world == 1 else copy.deepcopy(model)
    if world > 1:
        from torch.nn.parallel import DistributedDataParallel

        raw_model = DistributedDataParallel(raw_model)
        indices = [i for b in range(rank, args.samples // 64, world) for i in range(b * 64, b * 64 + 64)]
        raw_loader = DataLoader(Subset(data, indices), batch_size=64)
    else:
        raw_loader = DataLoader(data, batch_size=64)
    raw_opt = torch.optim.SGD(raw_model.parameters(), lr=1e-3)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    model, opt, loader = acc.prepare(model, opt, DataLoader(data, batch_size=64))
    times: dict[str, list[float]] = {"lib": [], "raw": []}
    for rep in range(args.reps + 1):  # the first round warms up and is dropped
        for name in ("raw", "lib") if rep % 2 == 0 else ("lib", "raw"):
            acc.wait_for_everyone()
            start = time.process_time()
            if name == "raw":
                raw_epoch(raw_model, raw_opt, raw_loader, accumulation)
            else:
                prepared_epoch(acc, model, opt, loader, accumulation)
            if rep:
                times[name].append(time.process_time() - start)
    result = {name: statistics.median(values) for name, values in times.items()}
    result["paired"] = statistics.median(p / r for p, r in zip(times["lib"], times["raw"], strict=True))
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
    return {"lib": result["prepared_s"], "raw": result["raw_s"], "paired": result["ratio"]}


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
    for _, name in _alternating(rounds, names):
        result = run_child(figure, name, extra, processes)
        column = {"accelerando": "acc", "accelerate": "ref", "raw": "raw"}[name]
        row.samples[column].append(result["lib"])
        if "raw" in result:
            row.samples["raw"].append(result["raw"])
        if name == "accelerando" and "paired" in result:
            row.acc_over_raw.append(result["paired"])


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
        paired: dict[int, dict[str, float]] = {}
        for i, column in _alternating(rounds, list(commands)):
            paired.setdefault(i, {})[column] = _first_line_delay(commands[column], out, env, column)
            rows[0].samples[column].append(paired[i][column])
        rows[0].acc_over_raw = [p["acc"] - p["raw"] for p in paired.values()]


def measure_checkpoint(rows: list[Row], args: argparse.Namespace) -> None:
    """save_state / load_state of both libraries and raw files, interleaved in one child process."""
    result = run_child(
        "checkpoint", "accelerando", ["--size-mb", str(args.size_mb), "--reps", str(args.rounds)]
    )
    save, scratch, load = rows
    save.samples = {"acc": result["acc_save"], "ref": result["ref_save"], "raw": result["raw_fsync"]}
    save.acc_over_raw = [a / r for a, r in zip(result["acc_save"], result["raw_fsync"], strict=True)]
    scratch.samples = {"acc": result["acc_scratch"], "ref": result["ref_save"], "raw": result["raw_write"]}
    scratch.acc_over_raw = [a / r for a, r in zip(result["acc_scratch"], result["raw_write"], strict=True)]
    load.samples = {"acc": result["acc_load"], "ref": result["ref_load"], "raw": result["raw_load"]}
    load.acc_over_raw = [a / r for a, r in zip(result["acc_load"], result["raw_load"], strict=True)]


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
            start = time.perf_counter()
            variants[name]()
            times[name].append(time.perf_counter() - start)
    shutil.rmtree(folder, ignore_errors=True)
    return times


CHILDREN["checkpoint"] = child_checkpoint  # type: ignore[assignment]


# ---------------------------------------------------------------- the table


def build_rows(args: argparse.Namespace) -> list[Row]:
    """Measure the selected groups; one Row per figure."""
    rows: list[Row] = []
    groups = args.only.split(",") if args.only else GROUPS
    step_extra = ["--samples", str(args.samples), "--reps", str(args.reps)]
    for group in groups:
        if rows:  # the figures so far, in case a long run is stopped
            print(table(rows), file=sys.stderr, flush=True)
        print(f"measuring {group} ...", file=sys.stderr, flush=True)
        if group == "first":
            rows.append(Row("first `Accelerator()` after `import torch` (CPU s)"))
            measure_children(rows[-1:], "first", [], args.rounds, raw=False)
        elif group in ("step", "ddp"):
            processes = 2 if group == "ddp" else 1
            for width in (512, 32):
                for accumulation in (1, 4) if group == "step" or width == 32 else (1,):
                    name = f"{'2-process DDP' if processes > 1 else 'training'} epoch, {width} wide, accumulation {accumulation} (CPU s)"
                    rows.append(Row(name))
                    extra = [*step_extra, "--width", str(width), "--accumulation", str(accumulation)]
                    measure_children(rows[-1:], "step", extra, args.rounds, raw=True, processes=processes)
        elif group == "dataloader":
            rows.append(Row(f"dataloader epoch, {args.samples * 8} samples, batch 32 (CPU s)"))
            extra = ["--samples", str(args.samples * 8), "--reps", str(args.reps)]
            measure_children(rows[-1:], "dataloader", extra, args.rounds, raw=True)
        elif group == "launch":
            for processes in (1, 2):
                base = "python" if processes == 1 else "torchrun"
                rows.append(Row(f"launch {processes} process(es) to first line (s; acc/raw: +s over {base})"))
                measure_launch(rows[-1:], processes, args.rounds)
        elif group == "checkpoint":
            rows += [
                Row(f"`save_state` {args.size_mb} MB + AdamW (raw: + fsync, the durable floor)"),
                Row("`save_state` scratch (durable=False; raw: no fsync)"),
                Row("`load_state` (raw: safetensors + torch.load + load_state_dict)"),
            ]
            measure_checkpoint(rows[-3:], args)
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


def table(rows: list[Row]) -> str:
    """The markdown table: figure | accelerando | reference | raw | acc/raw | acc/ref."""
    lines = [
        "| figure | accelerando | reference | raw | acc/raw | acc/ref |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        acc, ref, raw = row.cell("acc"), row.cell("ref"), row.cell("raw")
        over_raw = statistics.median(row.acc_over_raw) if row.acc_over_raw else None
        if over_raw is None and acc is not None and raw:
            over_raw = acc / raw
        launch = row.label.startswith("launch")
        ratio_raw = "-" if over_raw is None else (f"{over_raw:+.3f} s" if launch else f"{over_raw:.3f}")
        ratio_ref = _fmt(acc / ref if acc is not None and ref else None)
        lines.append(f"| {row.label} | {_fmt(acc)} | {_fmt(ref)} | {_fmt(raw)} | {ratio_raw} | {ratio_ref} |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options; ``--quick`` shrinks every size and count for a smoke run."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds per figure")
    parser.add_argument("--reps", type=int, default=11, help="epochs per child measurement")
    parser.add_argument("--samples", type=int, default=64 * 60, help="samples per training epoch")
    parser.add_argument("--size-mb", type=int, default=400, help="checkpoint model size")
    parser.add_argument("--modules", type=int, default=2000, help="modules for infer_auto_device_map")
    parser.add_argument("--quick", action="store_true", help="small sizes and 3 rounds: a smoke run")
    parser.add_argument("--only", help=f"comma-separated groups among {','.join(GROUPS)}")
    parser.add_argument("--markdown", help="also write the table to this file")
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="where checkpoints are written")
    parser.add_argument("--workdir", default="/tmp/bench_big_model")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--lib", help=argparse.SUPPRESS)
    parser.add_argument("--width", type=int, default=512, help=argparse.SUPPRESS)
    parser.add_argument("--accumulation", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.reps, args.samples = min(args.rounds, 3), min(args.reps, 5), 64 * 20
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
    rows = build_rows(args)
    load = os.getloadavg()
    header = (
        f"{os.cpu_count()} CPUs, load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} at the end; "
        f"medians of {args.rounds} alternating rounds"
    )
    text = f"{header}\n\n{table(rows)}\n"
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text)


if __name__ == "__main__":
    main()
