"""Early stopping across processes: any process may decide, all of them stop at the same step.

A process that sees a reason to stop calls ``accelerator.set_trigger()``; ``accelerator.check_trigger()``
is a collective that returns True on every process when any of them set it (and resets the flag).
Breaking out of the loop on one process only would leave the others waiting in the next collective.

    accelerando launch --cpu --num_processes 2 examples/by_feature/early_stopping.py --tiny --target_loss 0.3

The last line printed is ``METRICS {...}``: the step it stopped at, the steps it could have run, the
loss that triggered the stop, and which processes agreed.
"""

from __future__ import annotations

import argparse
import json

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from tqdm.auto import tqdm

from accelerando import Accelerator
from accelerando.utils import gather_object, set_seed


def make_data(n: int, seed: int) -> TensorDataset:
    """Four noisy Gaussian clusters in 8 dimensions, labelled by cluster."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(4, 8, generator=torch.Generator().manual_seed(0)) * 2
    labels = torch.randint(0, 4, (n,), generator=g)
    return TensorDataset(centres[labels] + torch.randn(n, 8, generator=g), labels)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--target_loss", type=float, default=0.2, help="stop once a process's loss is below")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tiny", action="store_true", help="small data: a few seconds on a CPU")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    set_seed(args.seed)
    accelerator = Accelerator()
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    train = DataLoader(make_data(256 if args.tiny else 4096, args.seed), batch_size=16, shuffle=True)
    model, optimizer, train = accelerator.prepare(model, optimizer, train)

    budget = args.epochs * len(train)
    step, stopped, trigger_loss = 0, False, None
    bar = tqdm(total=budget, disable=not accelerator.is_local_main_process)
    for _ in range(args.epochs):
        for inputs, labels in train:
            loss = nn.functional.cross_entropy(model(inputs), labels)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            step += 1
            bar.update()
            if loss.item() < args.target_loss:
                trigger_loss = loss.item()
                accelerator.set_trigger()  # this process wants to stop
            if accelerator.check_trigger():  # True everywhere as soon as one process wants to stop
                stopped = True
                break
        if stopped:
            break
    bar.close()

    # Every process reports the step it stopped at: the same on all of them.
    stop_steps = gather_object([step])
    metrics = {
        "stopped_early": stopped,
        "stop_step": step,
        "budget_steps": budget,
        "stop_steps_per_process": stop_steps,
        "trigger_loss": trigger_loss,
    }
    accelerator.print("METRICS " + json.dumps(metrics))
    accelerator.end_training()


if __name__ == "__main__":
    main()
