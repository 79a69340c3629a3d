"""FSDP with peak-memory tracking: shard parameters, gradients and optimizer state across processes.

A ``FullyShardedDataParallelPlugin`` turns FSDP on from the code (or launch with ``--use_fsdp`` and the
``--fsdp_*`` flags, or a config file, and pass no plugin). Each residual block is wrapped as its own
shard unit, so a process keeps only its slice of every block's weights between uses. The memory
monitor records the process's memory (and the GPU's, on GPUs) after every optimizer step; the peaks
are printed and written to ``<project_dir>/memory``. ``get_state_dict`` gathers the full weights
for saving.

    accelerando launch --cpu --num_processes 2 examples/by_feature/fsdp_with_peak_mem_tracking.py --tiny
    accelerando launch --num_processes 8 examples/by_feature/fsdp_with_peak_mem_tracking.py --width 4096

The last line printed is ``METRICS {...}``: parameters held by this process against the whole model,
memory peaks, accuracy, and the size of the gathered state dict.
"""

from __future__ import annotations

import argparse
import json

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from tqdm.auto import tqdm

from accelerando import Accelerator, FullyShardedDataParallelPlugin
from accelerando.utils import set_seed


def make_data(n: int, seed: int) -> TensorDataset:
    """Four noisy Gaussian clusters in 8 dimensions, labelled by cluster."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(4, 8, generator=torch.Generator().manual_seed(0)) * 2
    labels = torch.randint(0, 4, (n,), generator=g)
    return TensorDataset(centres[labels] + torch.randn(n, 8, generator=g), labels)


class ResidualBlock(nn.Module):
    """LayerNorm, a two-layer MLP and a skip connection: the unit FSDP shards."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.norm(x))


def build_model(width: int, depth: int) -> nn.Module:
    return nn.Sequential(
        nn.Linear(8, width),
        *[ResidualBlock(width) for _ in range(depth)],
        nn.LayerNorm(width),
        nn.Linear(width, 4),
    )


def local_numel(parameter: torch.Tensor) -> int:
    """Elements this process stores: its shard for a sharded (DTensor) parameter."""
    to_local = getattr(parameter, "to_local", None)
    return to_local().numel() if to_local is not None else parameter.numel()


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--project_dir", default="examples_output/fsdp_with_peak_mem_tracking")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tiny", action="store_true", help="a narrow model, small data")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    width, depth, epochs = (32, 2, 2) if args.tiny else (args.width, args.depth, args.epochs)
    plugin = FullyShardedDataParallelPlugin(
        fsdp_version=2,
        auto_wrap_policy="transformer_based_wrap",
        transformer_cls_names_to_wrap=["ResidualBlock"],
    )
    accelerator = Accelerator(fsdp_plugin=plugin, project_dir=args.project_dir)
    set_seed(args.seed)
    model = build_model(width, depth)
    total_params = sum(p.numel() for p in model.parameters())
    # With FSDP 2 the optimizer may be created before prepare(): prepare re-points it to the shards.
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    train = DataLoader(make_data(256 if args.tiny else 8192, args.seed), batch_size=16, shuffle=True)
    evaluation = DataLoader(make_data(128 if args.tiny else 1024, args.seed + 1), batch_size=64)
    model, optimizer, train, evaluation = accelerator.prepare(model, optimizer, train, evaluation)
    held_params = sum(local_numel(p) for p in model.parameters())
    accelerator.print(f"this process holds {held_params} of {total_params} parameters")

    monitor = accelerator.enable_memory_monitor(window=8)
    losses: list[float] = []
    bar = tqdm(total=epochs * len(train), disable=not accelerator.is_local_main_process)
    for _ in range(epochs):
        model.train()
        for inputs, labels in train:
            loss = nn.functional.cross_entropy(model(inputs), labels)
            accelerator.backward(loss)
            accelerator.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
            bar.update()
    bar.close()
    model.eval()
    correct = total = 0
    for inputs, labels in evaluation:
        with torch.no_grad():
            predictions = model(inputs).argmax(dim=-1)
        predictions, labels = accelerator.gather_for_metrics((predictions, labels))
        correct += (predictions == labels).sum().item()
        total += labels.numel()

    summary = monitor.summary()
    full_state = accelerator.get_state_dict(model)  # gathered on the main process
    accelerator.end_training()
    metrics = {
        "fsdp": str(accelerator.distributed_type),
        "total_params": total_params,
        "held_params": held_params,
        "peak_cpu_rss_mb": summary.get("peak_cpu_rss", 0) / 2**20,
        "peak_device_allocated_mb": summary.get("peak_device_allocated", 0) / 2**20,
        "first_loss": losses[0],
        "last_loss": sum(losses[-4:]) / 4,
        "accuracy": correct / total,
        "state_dict_params": sum(t.numel() for t in full_state.values()),
    }
    accelerator.print("METRICS " + json.dumps(metrics))


if __name__ == "__main__":
    main()
