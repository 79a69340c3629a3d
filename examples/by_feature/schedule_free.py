"""Schedule-free optimizers: no learning-rate schedule to tune, through the ``schedulefree`` package.

``schedulefree.AdamWScheduleFree`` keeps two sequences of weights: one it steps, one it averages. The
model must use the right one: call ``optimizer.train()`` before training and ``optimizer.eval()``
before evaluating or saving. The prepared optimizer forwards both calls. No scheduler is prepared:
the warm-up is an argument of the optimizer itself.

    pip install schedulefree
    accelerando launch --cpu --num_processes 2 examples/by_feature/schedule_free.py --tiny

The last line printed is ``METRICS {...}``: first and last loss, and the accuracy per epoch.
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
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--warmup_steps", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tiny", action="store_true", help="small data: a few seconds on a CPU")
    return parser.parse_args()


def main() -> None:
    try:
        import schedulefree
    except ImportError as error:
        raise SystemExit("This example needs the schedulefree package: pip install schedulefree") from error

    args = parse_args()
    epochs = 2 if args.tiny else args.epochs
    set_seed(args.seed)
    accelerator = Accelerator()
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))
    optimizer = schedulefree.AdamWScheduleFree(model.parameters(), lr=args.lr, warmup_steps=args.warmup_steps)
    train = DataLoader(make_data(256 if args.tiny else 4096, args.seed), batch_size=16, shuffle=True)
    evaluation = DataLoader(make_data(128 if args.tiny else 1024, args.seed + 1), batch_size=64)
    model, optimizer, train, evaluation = accelerator.prepare(model, optimizer, train, evaluation)

    losses: list[float] = []
    accuracies: list[float] = []
    bar = tqdm(total=epochs * len(train), disable=not accelerator.is_local_main_process)
    for _ in range(epochs):
        model.train()
        optimizer.train()  # the weights being stepped
        for inputs, labels in train:
            loss = nn.functional.cross_entropy(model(inputs), labels)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
            bar.update()
        model.eval()
        optimizer.eval()  # the averaged weights: evaluate (and save) these
        correct = total = 0
        for inputs, labels in evaluation:
            with torch.no_grad():
                predictions = model(inputs).argmax(dim=-1)
            predictions, labels = accelerator.gather_for_metrics((predictions, labels))
            correct += (predictions == labels).sum().item()
            total += labels.numel()
        accuracies.append(correct / total)
    bar.close()

    metrics = {"first_loss": sum(losses[:4]) / 4, "last_loss": sum(losses[-4:]) / 4, "accuracy": accuracies}
    accelerator.print("METRICS " + json.dumps(metrics))
    accelerator.end_training()


if __name__ == "__main__":
    main()
