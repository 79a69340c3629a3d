"""Experiment tracking: log hyperparameters and metrics to TensorBoard (or any supported tracker).

``Accelerator(log_with=..., project_dir=...)`` picks the trackers; ``init_trackers`` starts a run
and stores the hyperparameters; ``log`` sends values from the main process only (``reduce="mean"``
averages a value over the processes first); ``end_training`` closes the runs. With ``--with all`` every
installed tracker is used.

    accelerando launch --cpu --num_processes 2 examples/by_feature/tracking.py --tiny
    tensorboard --logdir examples_output/tracking

The last line printed is ``METRICS {...}``: final loss and accuracy, and the event files written.
"""

from __future__ import annotations

import argparse
import json
import os

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from tqdm.auto import tqdm

from accelerando import Accelerator
from accelerando.utils import set_seed

RUN_NAME = "tracking_example"


def make_data(n: int, seed: int) -> TensorDataset:
    """Four noisy Gaussian clusters in 8 dimensions, labelled by cluster."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(4, 8, generator=torch.Generator().manual_seed(0)) * 2
    labels = torch.randint(0, 4, (n,), generator=g)
    return TensorDataset(centres[labels] + torch.randn(n, 8, generator=g), labels)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--with", dest="log_with", default="tensorboard", help="a tracker name, or 'all'")
    parser.add_argument("--project_dir", default="examples_output/tracking")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch_size", type=int, default=16, help="per process")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tiny", action="store_true", help="small data: a few seconds on a CPU")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    epochs = 2 if args.tiny else args.epochs
    set_seed(args.seed)
    accelerator = Accelerator(log_with=args.log_with, project_dir=args.project_dir)
    hyperparameters = {"lr": args.lr, "batch_size": args.batch_size, "epochs": epochs, "seed": args.seed}
    accelerator.init_trackers(RUN_NAME, config=hyperparameters)

    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    train = DataLoader(
        make_data(256 if args.tiny else 4096, args.seed), batch_size=args.batch_size, shuffle=True
    )
    evaluation = DataLoader(make_data(128 if args.tiny else 1024, args.seed + 1), batch_size=64)
    model, optimizer, train, evaluation = accelerator.prepare(model, optimizer, train, evaluation)

    step, loss, accuracy = 0, torch.zeros(()), 0.0
    bar = tqdm(total=epochs * len(train), disable=not accelerator.is_local_main_process)
    for epoch in range(epochs):
        model.train()
        for inputs, labels in train:
            loss = nn.functional.cross_entropy(model(inputs), labels)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            step += 1
            # Each process has its own loss; reduce="mean" logs their average.
            accelerator.log({"train/loss": loss.detach()}, step=step, reduce="mean")
            bar.update()
        model.eval()
        correct = total = 0
        for inputs, labels in evaluation:
            with torch.no_grad():
                predictions = model(inputs).argmax(dim=-1)
            predictions, labels = accelerator.gather_for_metrics((predictions, labels))
            correct += (predictions == labels).sum().item()
            total += labels.numel()
        accuracy = correct / total
        accelerator.log({"eval/accuracy": accuracy, "epoch": epoch}, step=step)
    bar.close()
    accelerator.end_training()  # flushes and closes the event files

    written = []
    for root, _, files in os.walk(args.project_dir):
        written += [os.path.relpath(os.path.join(root, name), args.project_dir) for name in files]
    metrics = {"final_loss": loss.item(), "accuracy": accuracy, "steps": step, "files": sorted(written)}
    accelerator.print("METRICS " + json.dumps(metrics))


if __name__ == "__main__":
    main()
