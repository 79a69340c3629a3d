"""Quickstart: a plain PyTorch classifier made to run anywhere with five accelerando lines.

Run it as one process, or as N processes on CPU or GPUs:

    python examples/quickstart.py
    accelerando launch --cpu --num_processes 2 examples/quickstart.py --mixed_precision bf16
    torchrun --nproc_per_node 2 examples/quickstart.py --gradient_accumulation_steps 2

The lines marked "# accelerando" are the whole change from a single-device PyTorch script.
With --checkpoint_every N a crash-safe checkpoint is written every N optimizer steps; re-running
the same command with --resume continues from the newest complete one.
"""

from __future__ import annotations

import argparse
import json
import math

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from accelerando import Accelerator  # accelerando
from accelerando.checkpointing import latest_checkpoint, resume_point
from accelerando.utils import ProjectConfiguration, set_seed


def make_data(n: int, seed: int) -> TensorDataset:
    """Two interleaved spirals: a small problem a linear model cannot solve."""
    g = torch.Generator().manual_seed(seed)
    t = torch.rand(n, generator=g) * 3 * math.pi
    label = torch.randint(0, 2, (n,), generator=g)
    sign = label.float() * 2 - 1
    x = torch.stack([t * torch.cos(t) * sign, t * torch.sin(t) * sign], dim=1) / 10
    x += 0.05 * torch.randn(n, 2, generator=g)
    return TensorDataset(x, label)


class StepCounter:
    """Optimizer steps taken so far; registered for checkpointing so it survives a resume."""

    def __init__(self) -> None:
        self.value = 0

    def state_dict(self) -> dict[str, int]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.value = int(state["value"])


def evaluate(accelerator: Accelerator, model: nn.Module, evaluation: DataLoader) -> tuple[float, int]:
    """Accuracy over the whole evaluation set (every process's share, gathered) and its sample count."""
    model.eval()
    correct = total = 0
    for inputs, labels in evaluation:
        with torch.no_grad():
            predictions = model(inputs).argmax(dim=-1)
        predictions, labels = accelerator.gather_for_metrics((predictions, labels))  # accelerando
        correct += int((predictions == labels).sum().item())
        total += labels.numel()
    return correct / total, total


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--mixed_precision", choices=["no", "fp16", "bf16"], default=None)
    parser.add_argument("--gradient_accumulation_steps", type=int, default=None)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--project_dir", default="examples_output/quickstart")
    parser.add_argument("--checkpoint_every", type=int, default=0, help="optimizer steps between checkpoints")
    parser.add_argument("--resume", action="store_true", help="continue from the newest complete checkpoint")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    set_seed(args.seed)
    accelerator = Accelerator(  # accelerando
        mixed_precision=args.mixed_precision,
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        project_config=ProjectConfiguration(
            project_dir=args.project_dir, automatic_checkpoint_naming=True, total_limit=2
        ),
    )
    model = nn.Sequential(nn.Linear(2, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    # A generator of its own makes the shuffling order part of the checkpoint (bit-exact resume).
    shuffle_rng = torch.Generator().manual_seed(args.seed)
    train = DataLoader(
        make_data(4096, args.seed), batch_size=args.batch_size, shuffle=True, generator=shuffle_rng
    )
    evaluation = DataLoader(make_data(1000, args.seed + 1), batch_size=128)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs * len(train))
    model, optimizer, train, evaluation, scheduler = accelerator.prepare(  # accelerando
        model, optimizer, train, evaluation, scheduler
    )

    steps = StepCounter()
    accelerator.register_for_checkpointing(steps)
    start_epoch, skip = 0, 0
    if args.resume and latest_checkpoint(args.project_dir):
        accelerator.load_state()  # the newest complete checkpoint; damaged ones are skipped
        point = resume_point(accelerator)
        if point is not None:
            start_epoch, skip = point.epoch, point.batches_to_skip
            accelerator.print(f"resumed at epoch {start_epoch}, skipping {skip} batches already seen")

    accuracy, total = float("nan"), 0
    for epoch in range(start_epoch, args.epochs):
        model.train()
        # The prepared loader counts its epochs itself (and load_state restores the count).
        loader = accelerator.skip_first_batches(train, skip) if skip else train
        skip = 0
        loss: torch.Tensor | None = None
        for inputs, labels in loader:
            with accelerator.accumulate(model):  # accelerando
                loss = nn.functional.cross_entropy(model(inputs), labels)
                accelerator.backward(loss)  # accelerando
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            if accelerator.sync_gradients:
                steps.value += 1
                if args.checkpoint_every and steps.value % args.checkpoint_every == 0:
                    accelerator.save_state()
        accuracy, total = evaluate(accelerator, model, evaluation)
        last_loss = float("nan") if loss is None else loss.item()
        accelerator.print(f"epoch {epoch}: loss {last_loss:.4f} accuracy {accuracy:.3f} ({total} samples)")
    if total == 0:  # resumed after the last epoch's last step: nothing left to train, evaluate once
        accuracy, total = evaluate(accelerator, model, evaluation)
    accelerator.print(f"final accuracy: {accuracy:.3f}")
    metrics = {"accuracy": accuracy, "eval_samples": total, "optimizer_steps": steps.value}
    accelerator.print("METRICS " + json.dumps(metrics))
    accelerator.end_training()


if __name__ == "__main__":
    main()
