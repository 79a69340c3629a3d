"""Checkpointing and resume: save the whole training state, stop, and continue bit-exactly.

``save_state()`` writes model, optimizer, scheduler, RNG states, dataloader positions and any object
registered with ``register_for_checkpointing`` into ``<project_dir>/checkpoints/checkpoint_<n>``;
the folder appears only once complete, so a crash mid-save never leaves a checkpoint that looks good.
``load_state()`` restores it; ``accelerator.resume_point`` says which epoch and how many of its batches
were already seen, and ``skip_first_batches`` skips them.

    accelerando launch --cpu --num_processes 2 examples/by_feature/checkpointing.py --tiny \\
        --checkpointing_steps 4 --stop_after 6
    accelerando launch --cpu --num_processes 2 examples/by_feature/checkpointing.py --tiny \\
        --checkpointing_steps 4 --resume_from_checkpoint latest

The second run ends with the same weights (``weights_checksum`` in its ``METRICS`` line) as a run
that was never stopped. ``--resume_from_checkpoint latest`` means "the newest checkpoint, if any": with
none yet (a first run) it says so in one line and starts from the beginning, so one command both
starts and continues a run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from tqdm.auto import tqdm

from accelerando import Accelerator
from accelerando.checkpointing import latest_checkpoint
from accelerando.utils import ProjectConfiguration, set_seed


def make_data(n: int, seed: int) -> TensorDataset:
    """Four noisy Gaussian clusters in 8 dimensions, labelled by cluster."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(4, 8, generator=torch.Generator().manual_seed(0)) * 2
    labels = torch.randint(0, 4, (n,), generator=g)
    return TensorDataset(centres[labels] + torch.randn(n, 8, generator=g), labels)


class Progress:
    """Optimizer steps taken so far: registered for checkpointing, so it is saved and restored too."""

    def __init__(self) -> None:
        self.steps = 0

    def state_dict(self) -> dict[str, int]:
        return {"steps": self.steps}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.steps = int(state["steps"])


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--project_dir", default="examples_output/checkpointing")
    parser.add_argument(
        "--checkpointing_steps", default="epoch", help="'epoch', or a number of optimizer steps"
    )
    parser.add_argument(
        "--resume_from_checkpoint",
        default=None,
        help="a checkpoint folder, or 'latest' (the newest one; none yet: start from the beginning)",
    )
    parser.add_argument("--stop_after", type=int, default=0, help="exit after this many steps (a crash)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch_size", type=int, default=16, help="per process")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tiny", action="store_true", help="small data: a few seconds on a CPU")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    set_seed(args.seed)
    accelerator = Accelerator(
        project_config=ProjectConfiguration(
            project_dir=args.project_dir, automatic_checkpoint_naming=True, total_limit=3
        )
    )
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    # The shuffling generator is prepared with the loader, so its state is part of the checkpoint.
    shuffle = torch.Generator().manual_seed(args.seed)
    train = DataLoader(
        make_data(256 if args.tiny else 4096, args.seed),
        batch_size=args.batch_size,
        shuffle=True,
        generator=shuffle,
    )
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10, gamma=0.7)
    model, optimizer, train, scheduler = accelerator.prepare(model, optimizer, train, scheduler)
    progress_state = Progress()
    accelerator.register_for_checkpointing(progress_state)

    start_epoch, skip, resumed_from = 0, 0, None
    resume = args.resume_from_checkpoint
    if resume == "latest" and latest_checkpoint(args.project_dir) is None:
        accelerator.print(f"no checkpoint under {args.project_dir!r} yet: starting from the beginning")
        resume = None
    if resume:
        folder = None if resume == "latest" else resume
        accelerator.load_state(folder)  # None: the newest complete checkpoint of the project
        point = accelerator.resume_point
        if point is not None:  # None only when the load restored nothing
            start_epoch, skip = point.epoch, point.batches_to_skip
            resumed_from = os.path.basename(point.checkpoint)
            accelerator.print(f"resumed from {resumed_from}: epoch {start_epoch}, skipping {skip} batches")

    every = None if args.checkpointing_steps == "epoch" else int(args.checkpointing_steps)
    bar = tqdm(
        total=args.epochs * len(train),
        initial=progress_state.steps,
        disable=not accelerator.is_local_main_process,
    )
    loss = torch.zeros(())
    for _ in range(start_epoch, args.epochs):
        # The prepared loader counts its epochs itself (and load_state restores the count).
        loader = accelerator.skip_first_batches(train, skip) if skip else train
        skip = 0
        for inputs, labels in loader:
            loss = nn.functional.cross_entropy(model(inputs), labels)
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            progress_state.steps += 1
            bar.update()
            if every and progress_state.steps % every == 0:
                accelerator.save_state()
            if args.stop_after and progress_state.steps == args.stop_after:
                accelerator.print(f"stopping after step {progress_state.steps}, as asked")
                accelerator.end_training()
                sys.exit(0)
        if every is None:
            accelerator.save_state()
    bar.close()

    weights = accelerator.unwrap_model(model).state_dict()
    checksum = sum(float(t.double().abs().sum()) for t in weights.values())
    checkpoints = sorted(os.listdir(os.path.join(args.project_dir, "checkpoints")))
    metrics = {
        "steps": progress_state.steps,
        "final_loss": accelerator.reduce(loss.detach(), reduction="mean").item(),
        "weights_checksum": checksum,
        "resumed_from": resumed_from,
        "checkpoints": checkpoints,
    }
    accelerator.print("METRICS " + json.dumps(metrics))
    accelerator.end_training()


if __name__ == "__main__":
    main()
