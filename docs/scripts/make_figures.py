"""Generate the documentation's figures into ``docs/img/`` (run from anywhere, CPU only, ~10 s).

    python docs/scripts/make_figures.py [--out docs/img]

Three pictures, each produced by the library itself or from its own output:

* ``memory_timeline.png``: the PNG timeline :class:`accelerando.backends.monitoring.MemoryMonitor` writes at
  the end of a run, from a short CPU training that grows a list of tensors on purpose (a leak).
* ``device_map.png``: where :func:`accelerando.infer_auto_device_map` places each module of a small
  transformer-shaped model under a ``max_memory`` budget (two accelerators, CPU, disk).
* ``launch_processes.png``: the processes ``accelerando launch`` starts, drawn from the same
  numbers the launch plan uses (machines x processes per machine).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import tempfile

import torch
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch
from torch import nn

DEFAULT_OUT = pathlib.Path(__file__).resolve().parents[1] / "img"
# No creation date or library version in the PNG, so re-running the script changes no bytes.
_PNG_METADATA = {"Software": None}


def memory_timeline(out: pathlib.Path, steps: int = 60) -> pathlib.Path:
    """Train a tiny model on CPU with the memory monitor on and keep the PNG it writes."""
    from accelerando import Accelerator
    from accelerando.state import AcceleratorState, GradientState

    with tempfile.TemporaryDirectory() as folder:
        accelerator = Accelerator(cpu=True)
        model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        model, optimizer = accelerator.prepare(model, optimizer)
        monitor = accelerator.enable_memory_monitor(window=20, output_dir=folder, leak_min_growth_mb=4.0)
        kept = []  # the deliberate leak: one 1 MiB tensor per step stays referenced
        generator = torch.Generator().manual_seed(0)
        for _ in range(steps):
            inputs = torch.randn(64, 256, generator=generator)
            loss = model(inputs).pow(2).mean()
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            kept.append(torch.ones(256, 1024))
        accelerator.end_training()
        assert monitor.leaks, "the deliberate leak was not reported"
        target = out / "memory_timeline.png"
        shutil.copyfile(os.path.join(folder, "memory_rank0.png"), target)
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    return target


class _Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.attention = nn.Linear(width, width)
        self.mlp_in = nn.Linear(width, 4 * width)
        self.mlp_out = nn.Linear(4 * width, width)


class _TinyDecoder(nn.Module):
    def __init__(self, width: int = 64, layers: int = 12, vocab: int = 1000) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(_Block(width) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.lm_head = nn.Linear(width, vocab)


DEVICE_MAP_BUDGET = {0: "700KB", 1: "700KB", "cpu": "700KB", "disk": "100MB"}


def device_map_figure(out: pathlib.Path) -> pathlib.Path:
    """Draw each module of a small model as a bar as wide as its size, coloured by its device."""
    from accelerando import compute_module_sizes, infer_auto_device_map, init_empty_weights

    with init_empty_weights():
        model = _TinyDecoder()
    device_map = infer_auto_device_map(
        model, max_memory=DEVICE_MAP_BUDGET, no_split_module_classes=["_Block"]
    )
    sizes = compute_module_sizes(model)
    modules = [name for name, _ in model.named_children() if name != "blocks"]
    order = ["embed", *(f"blocks.{i}" for i in range(len(model.blocks))), *modules[1:]]

    def device_of(name: str) -> object:
        while name not in device_map:
            name = name.rpartition(".")[0]
        return device_map[name]

    colours = {0: "#4C72B0", 1: "#55A868", "cpu": "#DD8452", "disk": "#8172B3"}
    labels = {0: "GPU 0", 1: "GPU 1", "cpu": "CPU memory", "disk": "disk (offloaded)"}
    fig = Figure(figsize=(10, 3.2))
    axis = fig.subplots()
    left = 0.0
    for name in order:
        width = sizes[name] / 1024
        device = device_of(name)
        axis.barh(0, width, left=left, color=colours[device], edgecolor="white", height=0.6)
        if width > 40:  # no label on slivers such as the final norm
            axis.text(left + width / 2, 0, name.replace("blocks.", "b"), ha="center", va="center", fontsize=7,
                      color="white", rotation=90)  # fmt: skip
        left += width
    for device, colour in colours.items():
        budget = DEVICE_MAP_BUDGET[device]
        axis.barh(0, 0, color=colour, label=f"{labels[device]} (budget {budget})")
    axis.set_yticks([])
    axis.set_xlabel("KiB of weights, in execution order")
    axis.set_title("infer_auto_device_map(model, max_memory=..., no_split_module_classes=['_Block'])")
    axis.legend(loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=4, fontsize=8, frameon=False)
    fig.tight_layout()
    target = out / "device_map.png"
    fig.savefig(target, dpi=110, metadata=_PNG_METADATA)
    return target


def _box(axis, x: float, y: float, w: float, h: float, text: str, colour: str) -> None:
    axis.add_patch(
        FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02", facecolor=colour, edgecolor="#333333")
    )
    axis.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=8)


def _arrow(axis, start: tuple[float, float], end: tuple[float, float], style: str = "-|>") -> None:
    axis.add_patch(FancyArrowPatch(start, end, arrowstyle=style, mutation_scale=10, color="#333333"))


def launch_diagram(out: pathlib.Path, machines: int = 2, per_machine: int = 2) -> pathlib.Path:
    """Draw launcher -> elastic agent -> workers -> one process group, for machines x processes."""
    fig = Figure(figsize=(10, 5.2))
    axis = fig.subplots()
    axis.set_xlim(0, 10)
    axis.set_ylim(0, 6)
    axis.axis("off")
    width = 10 / machines
    worker_boxes = []
    for m in range(machines):
        x0 = m * width + 0.2
        axis.add_patch(FancyBboxPatch((x0, 1.6), width - 0.4, 4.2, boxstyle="round,pad=0.02",
                                      facecolor="#F4F4F4", edgecolor="#999999", linestyle="--"))  # fmt: skip
        axis.text(x0 + 0.1, 5.6, f"machine {m} (--machine_rank {m})", fontsize=8, va="top")
        centre = x0 + (width - 0.4) / 2
        _box(axis, centre - 1.5, 4.4, 3.0, 0.8, "accelerando launch\nsettings resolved, preflight", "#CFE2F3")
        _box(
            axis,
            centre - 1.5,
            3.1,
            3.0,
            0.8,
            "elastic agent (torch.distributed.run)\nrendezvous, restarts",
            "#D9EAD3",
        )
        _arrow(axis, (centre, 4.4), (centre, 3.9))
        w_width = (width - 0.8) / per_machine
        for p in range(per_machine):
            rank = m * per_machine + p
            x = x0 + 0.2 + p * w_width
            _box(
                axis,
                x + 0.05,
                1.8,
                w_width - 0.2,
                0.8,
                f"worker rank {rank}\nlocal rank {p}\nyour script",
                "#FFF2CC",
            )
            _arrow(axis, (centre, 3.1), (x + w_width / 2 - 0.05, 2.6))
            worker_boxes.append(x + w_width / 2 - 0.05)
    _box(axis, 0.4, 0.2, 9.2, 0.7, f"one process group: world size {machines * per_machine} "
         "(gloo on CPU, nccl on GPUs); collectives in prepare / backward / gather", "#F4CCCC")  # fmt: skip
    for x in worker_boxes:
        _arrow(axis, (x, 1.8), (x, 0.9), style="<|-|>")
    axis.set_title(f"accelerando launch --num_machines {machines} --num_processes {machines * per_machine}",
                   fontsize=10)  # fmt: skip
    fig.tight_layout()
    target = out / "launch_processes.png"
    fig.savefig(target, dpi=110, metadata=_PNG_METADATA)
    return target


def main(argv: list[str] | None = None) -> list[pathlib.Path]:
    """Write the three figures; returns their paths."""
    parser = argparse.ArgumentParser(description="Generate the documentation figures.")
    parser.add_argument("--out", type=pathlib.Path, default=DEFAULT_OUT, help="folder for the PNG files")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    written = [memory_timeline(args.out), device_map_figure(args.out), launch_diagram(args.out)]
    for path in written:
        print(path)
    return written


if __name__ == "__main__":
    main()
