"""Gradient accumulation: step the optimizer once every N batches, for a larger effective batch.

Inside ``with accelerator.accumulate(model):`` the optimizer and scheduler steps and ``zero_grad`` are
real only every N-th batch (and at the end of the data); in between, gradients add up and, under DDP,
no gradient synchronisation happens. ``accelerator.sync_gradients`` tells which batches end a step.

    accelerando launch --cpu --num_processes 2 examples/by_feature/gradient_accumulation.py --tiny \\
        --gradient_accumulation_steps 4

The last line printed is ``METRICS {...}``: batches seen, optimizer steps taken, first and last loss.
"""

from __future__ import annotations

import argparse
import json

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from tqdm.auto import tqdm

from accelerando import Accelerator
from accelerando.utils import set_seed


def make_data(n: int, seed: int) -> TensorDataset:
    """Four noisy Gaussian clusters in 8 dimensions, labelled by cluster."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(4, 8, generator=torch.Generator().manual_seed(0)) * 2
    labels = torch.randint(0, 4, (n,), generator=g)
    return TensorDataset(centres[labels] + torch.randn(n, 8, generator=g), labels)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--gradient_accumulation_steps", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batch_size", type=int, default=8, help="per process and per micro-batch")
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tiny", action="store_true", help="small data: a few seconds on a CPU")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    epochs = 3 if args.tiny else args.epochs
    set_seed(args.seed)
    accelerator = Accelerator(gradient_accumulation_steps=args.gradient_accumulation_steps)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    train = DataLoader(
        make_data(320 if args.tiny else 4096, args.seed), batch_size=args.batch_size, shuffle=True
    )
    model, optimizer, train = accelerator.prepare(model, optimizer, train)

    batches = optimizer_steps = 0
    losses: list[float] = []
    bar = tqdm(total=epochs * len(train), disable=not accelerator.is_local_main_process)
    for _ in range(epochs):
        for inputs, labels in train:
            with accelerator.accumulate(model):
                loss = nn.functional.cross_entropy(model(inputs), labels)
                accelerator.backward(loss)  # divides by the accumulation steps for you
                optimizer.step()  # a no-op until the N-th batch
                optimizer.zero_grad()
            batches += 1
            if accelerator.sync_gradients:
                optimizer_steps += 1
            losses.append(loss.item())
            bar.set_postfix(steps=optimizer_steps)
            bar.update()
    bar.close()

    window = args.gradient_accumulation_steps * 2
    metrics = {
        "batches": batches,
        "optimizer_steps": optimizer_steps,
        "gradient_accumulation_steps": accelerator.gradient_accumulation_steps,
        "first_loss": sum(losses[:window]) / window,
        "last_loss": sum(losses[-window:]) / window,
    }
    accelerator.print("METRICS " + json.dumps(metrics))
    accelerator.end_training()


if __name__ == "__main__":
    main()
