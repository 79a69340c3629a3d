"""Metrics over many processes: count every evaluation sample exactly once.

Each process evaluates its own share of the data. To even out the last batch, the prepared dataloader
repeats a few samples from the start of the data set on the processes that would run short; a plain
``gather`` then counts those twice. ``gather_for_metrics`` drops them, so the gathered predictions are
exactly the data set, in order. Non-tensor results (strings here) go through it too.

    accelerando launch --cpu --num_processes 2 examples/by_feature/multi_process_metrics.py --tiny

The last line printed is ``METRICS {...}``: data set size, samples counted by ``gather`` and by
``gather_for_metrics``, and the accuracy.
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

NAMES = ["north", "east", "south", "west"]


def make_data(n: int, seed: int) -> TensorDataset:
    """Four noisy Gaussian clusters in 8 dimensions, labelled by cluster."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(4, 8, generator=torch.Generator().manual_seed(0)) * 2
    labels = torch.randint(0, 4, (n,), generator=g)
    return TensorDataset(centres[labels] + torch.randn(n, 8, generator=g), labels)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--eval_size", type=int, default=1001, help="not a multiple of the batch on purpose")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tiny", action="store_true", help="small data: a few seconds on a CPU")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    epochs, eval_size = (2, 101) if args.tiny else (args.epochs, args.eval_size)
    set_seed(args.seed)
    accelerator = Accelerator()
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    train = DataLoader(make_data(256 if args.tiny else 4096, args.seed), batch_size=16, shuffle=True)
    evaluation = DataLoader(make_data(eval_size, args.seed + 1), batch_size=16)
    model, optimizer, train, evaluation = accelerator.prepare(model, optimizer, train, evaluation)

    bar = tqdm(total=epochs * len(train), disable=not accelerator.is_local_main_process)
    for _ in range(epochs):
        model.train()
        for inputs, labels in train:
            accelerator.backward(nn.functional.cross_entropy(model(inputs), labels))
            optimizer.step()
            optimizer.zero_grad()
            bar.update()
    bar.close()

    model.eval()
    naive = correct = counted = 0
    names: list[str] = []
    for inputs, labels in evaluation:
        with torch.no_grad():
            predictions = model(inputs).argmax(dim=-1)
        naive += accelerator.gather(labels).numel()  # includes the padding samples
        predictions, labels = accelerator.gather_for_metrics((predictions, labels))
        correct += (predictions == labels).sum().item()
        counted += labels.numel()
        # Any picklable object works too: here, one class name per sample.
        local_names = [NAMES[int(i)] for i in model(inputs).argmax(dim=-1)]
        names += accelerator.gather_for_metrics(local_names, use_gather_object=True)

    metrics = {
        "dataset_size": eval_size,
        "gather_samples": naive,
        "gather_for_metrics_samples": counted,
        "object_samples": len(names),
        "accuracy": correct / counted,
    }
    accelerator.print("METRICS " + json.dumps(metrics))
    accelerator.end_training()


if __name__ == "__main__":
    main()
