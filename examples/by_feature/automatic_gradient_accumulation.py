"""Automatic gradient accumulation: keep the effective batch size when the batch must shrink.

``find_executable_batch_size`` calls the training function with a batch size, and when it runs out of
memory calls it again with a smaller one. Here each retry halves the batch and doubles the gradient
accumulation steps, so every optimizer step still sees ``--observed_batch_size`` samples per process.
Everything the step allocates (model, optimizer, dataloader) is built inside the function, after
``accelerator.free_memory()`` has dropped what the failed try prepared.

A CPU seldom runs out of memory, so ``--simulate_memory_for N`` makes any batch above N samples raise
the out-of-memory error a GPU would.

    accelerando launch --cpu --num_processes 2 examples/by_feature/automatic_gradient_accumulation.py \\
        --tiny --observed_batch_size 32 --simulate_memory_for 8

The last line printed is ``METRICS {...}``: the batch size that ran, the accumulation steps, the tries.
"""

from __future__ import annotations

import argparse
import json

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from tqdm.auto import tqdm

from accelerando import Accelerator, find_executable_batch_size
from accelerando.utils import set_seed


def make_data(n: int, seed: int) -> TensorDataset:
    """Four noisy Gaussian clusters in 8 dimensions, labelled by cluster."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(4, 8, generator=torch.Generator().manual_seed(0)) * 2
    labels = torch.randint(0, 4, (n,), generator=g)
    return TensorDataset(centres[labels] + torch.randn(n, 8, generator=g), labels)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--observed_batch_size", type=int, default=64, help="samples per optimizer step")
    parser.add_argument("--simulate_memory_for", type=int, default=0, help="largest batch that 'fits'")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tiny", action="store_true", help="small data: a few seconds on a CPU")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    epochs = 2 if args.tiny else args.epochs
    accelerator = Accelerator()
    data = make_data(512 if args.tiny else 8192, args.seed)

    def forward(model: nn.Module, inputs: torch.Tensor) -> torch.Tensor:
        if args.simulate_memory_for and inputs.shape[0] > args.simulate_memory_for:
            raise torch.OutOfMemoryError(f"simulated: a batch of {inputs.shape[0]} does not fit")
        return model(inputs)

    # Halving keeps the batch size a divisor of the observed batch size.
    @find_executable_batch_size(
        starting_batch_size=args.observed_batch_size, reduce_batch_size_fn=lambda s: s // 2
    )
    def train(batch_size: int) -> dict[str, float]:
        accelerator.free_memory()  # forget what a failed try prepared
        accelerator.gradient_accumulation_steps = args.observed_batch_size // batch_size
        accelerator.print(f"trying batch size {batch_size} x {accelerator.gradient_accumulation_steps} steps")
        set_seed(args.seed)
        model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))
        optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
        loader = DataLoader(data, batch_size=batch_size, shuffle=True)
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
        losses, steps = [], 0
        bar = tqdm(total=epochs * len(loader), disable=not accelerator.is_local_main_process)
        for _ in range(epochs):
            for inputs, labels in loader:
                with accelerator.accumulate(model):
                    loss = nn.functional.cross_entropy(forward(model, inputs), labels)
                    accelerator.backward(loss)
                    optimizer.step()
                    optimizer.zero_grad()
                steps += int(accelerator.sync_gradients)
                losses.append(loss.item())
                bar.update()
        bar.close()
        window = max(len(losses) // 8, 1)
        return {
            "optimizer_steps": steps,
            "first_loss": sum(losses[:window]) / window,
            "last_loss": sum(losses[-window:]) / window,
        }

    result = train()  # no batch size: the decorator supplies it
    metrics = {
        "batch_size": train.batch_size,
        "gradient_accumulation_steps": accelerator.gradient_accumulation_steps,
        "tries": train.tries,
        **result,
    }
    accelerator.print("METRICS " + json.dumps(metrics))
    accelerator.end_training()


if __name__ == "__main__":
    main()
