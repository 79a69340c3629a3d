"""LocalSGD: synchronise the model every K optimizer steps instead of every step.

Inside ``with LocalSGD(...)`` the processes train independently (no gradient all-reduce); every
``local_sgd_steps`` calls of ``local_sgd.step()`` the parameters are averaged across processes, and
once more when the block ends. Fewer synchronisations help when the network is the bottleneck.
Works with plain data parallelism (DDP) and with gradient accumulation.

    accelerando launch --cpu --num_processes 2 examples/by_feature/local_sgd.py --tiny --local_sgd_steps 4

The last line printed is ``METRICS {...}``: accuracy, steps, and whether the processes ended with
identical parameters.
"""

from __future__ import annotations

import argparse
import json

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from tqdm.auto import tqdm

from accelerando import Accelerator
from accelerando.local_sgd import LocalSGD
from accelerando.utils import set_seed


def make_data(n: int, seed: int) -> TensorDataset:
    """Four noisy Gaussian clusters in 8 dimensions, labelled by cluster."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(4, 8, generator=torch.Generator().manual_seed(0)) * 2
    labels = torch.randint(0, 4, (n,), generator=g)
    return TensorDataset(centres[labels] + torch.randn(n, 8, generator=g), labels)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--local_sgd_steps", type=int, default=8)
    parser.add_argument("--gradient_accumulation_steps", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tiny", action="store_true", help="small data: a few seconds on a CPU")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    epochs = 2 if args.tiny else args.epochs
    set_seed(args.seed)
    accelerator = Accelerator(gradient_accumulation_steps=args.gradient_accumulation_steps)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    train = DataLoader(make_data(256 if args.tiny else 4096, args.seed), batch_size=16, shuffle=True)
    evaluation = DataLoader(make_data(128 if args.tiny else 1024, args.seed + 1), batch_size=64)
    model, optimizer, train, evaluation = accelerator.prepare(model, optimizer, train, evaluation)

    steps = 0
    bar = tqdm(total=epochs * len(train), disable=not accelerator.is_local_main_process)
    for _ in range(epochs):
        model.train()
        with LocalSGD(accelerator, model, local_sgd_steps=args.local_sgd_steps) as local_sgd:
            for inputs, labels in train:
                with accelerator.accumulate(model):
                    accelerator.backward(nn.functional.cross_entropy(model(inputs), labels))
                    optimizer.step()
                    optimizer.zero_grad()
                    local_sgd.step()  # counts the step; averages the parameters every K steps
                steps += 1
                bar.update()
    bar.close()

    # After the block the parameters are averaged: every process holds the same model.
    flat = torch.cat([p.detach().flatten() for p in accelerator.unwrap_model(model).parameters()])
    in_sync = bool(
        torch.equal(accelerator.gather(flat[None]).amin(0), accelerator.gather(flat[None]).amax(0))
    )
    model.eval()
    correct = total = 0
    for inputs, labels in evaluation:
        with torch.no_grad():
            predictions = model(inputs).argmax(dim=-1)
        predictions, labels = accelerator.gather_for_metrics((predictions, labels))
        correct += (predictions == labels).sum().item()
        total += labels.numel()
    metrics = {
        "accuracy": correct / total,
        "steps": steps,
        "local_sgd_steps": args.local_sgd_steps,
        "in_sync": in_sync,
    }
    accelerator.print("METRICS " + json.dumps(metrics))
    accelerator.end_training()


if __name__ == "__main__":
    main()
