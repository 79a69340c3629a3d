"""DeepSpeed from a config file: ZeRO stage, optimizer and scheduler described in JSON.

Launch with ``--use_deepspeed --deepspeed_config_file <json>`` (or name the file in an accelerando
config). ``"auto"`` values in the JSON are filled in by ``prepare()`` from what the script builds:
micro-batch size from the dataloader, accumulation steps, learning rate and weight decay from the
optimizer, step counts from the scheduler. When the JSON has its own ``optimizer`` / ``scheduler``
section, the script passes ``DummyOptim`` / ``DummyScheduler`` placeholders carrying those numbers
and DeepSpeed builds the real ones. The config shipped beside this script is ZeRO-2 in fp32, which
also runs on CPUs (set ``DS_ACCELERATOR=cpu`` where there is no GPU).

    DS_ACCELERATOR=cpu accelerando launch --cpu --num_processes 2 --use_deepspeed \\
        --deepspeed_config_file examples/by_feature/deepspeed_config.json \\
        examples/by_feature/deepspeed_with_config_support.py --tiny

The last line printed is ``METRICS {...}``: ZeRO stage, the resolved batch sizes, losses, accuracy.
"""

from __future__ import annotations

import argparse
import json

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from tqdm.auto import tqdm

from accelerando import Accelerator
from accelerando.utils import DummyOptim, DummyScheduler, set_seed


def make_data(n: int, seed: int) -> TensorDataset:
    """Four noisy Gaussian clusters in 8 dimensions, labelled by cluster."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(4, 8, generator=torch.Generator().manual_seed(0)) * 2
    labels = torch.randint(0, 4, (n,), generator=g)
    return TensorDataset(centres[labels] + torch.randn(n, 8, generator=g), labels)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch_size", type=int, default=16, help="per process")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--weight_decay", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tiny", action="store_true", help="small data: a few seconds on a CPU")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    epochs = 2 if args.tiny else args.epochs
    set_seed(args.seed)
    accelerator = Accelerator()
    plugin = accelerator.state.deepspeed_plugin
    if plugin is None:
        raise SystemExit(
            "This example needs DeepSpeed: launch it with --use_deepspeed --deepspeed_config_file <json>."
        )
    ds_config = plugin.deepspeed_config

    model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
    train = DataLoader(
        make_data(256 if args.tiny else 8192, args.seed), batch_size=args.batch_size, shuffle=True
    )
    evaluation = DataLoader(make_data(128 if args.tiny else 1024, args.seed + 1), batch_size=64)
    # The optimizer and scheduler come from the JSON when it describes them, else from the code.
    if "optimizer" in ds_config:
        optimizer = DummyOptim(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    steps = epochs * len(train) // accelerator.num_processes // accelerator.gradient_accumulation_steps
    if "scheduler" in ds_config:
        scheduler = DummyScheduler(optimizer, total_num_steps=steps, warmup_num_steps=max(steps // 10, 1))
    else:
        scheduler = torch.optim.lr_scheduler.LinearLR(optimizer, 1.0, 0.0, total_iters=steps)
    model, optimizer, train, evaluation, scheduler = accelerator.prepare(
        model, optimizer, train, evaluation, scheduler
    )

    losses: list[float] = []
    bar = tqdm(total=epochs * len(train), disable=not accelerator.is_local_main_process)
    for _ in range(epochs):
        model.train()
        for inputs, labels in train:
            with accelerator.accumulate(model):
                loss = nn.functional.cross_entropy(model(inputs), labels)
                accelerator.backward(loss)  # the engine's backward: clipping as the JSON says
                optimizer.step()
                scheduler.step()
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

    from deepspeed import DeepSpeedEngine

    assert isinstance(model, DeepSpeedEngine)  # under DeepSpeed, prepare() returned the engine
    metrics = {
        "zero_stage": model.zero_optimization_stage(),
        # The batch sizes the engine runs with: the "auto" values of the JSON, filled in by prepare().
        "train_batch_size": model.train_batch_size(),
        "micro_batch_size": model.train_micro_batch_size_per_gpu(),
        "optimizer_from_config": "optimizer" in ds_config,
        "first_loss": sum(losses[:4]) / 4,
        "last_loss": sum(losses[-4:]) / 4,
        "accuracy": correct / total,
    }
    accelerator.print("METRICS " + json.dumps(metrics))
    accelerator.end_training()


if __name__ == "__main__":
    main()
