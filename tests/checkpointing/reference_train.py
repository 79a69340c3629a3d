"""Run by the tests with the reference ``accelerate`` package: train, save mid-run, record the end.

Usage: python reference_train.py PROJECT_DIR SAVE_EPOCH SAVE_BATCH

Writes ``PROJECT_DIR/checkpoints/checkpoint_0`` (automatic naming) after batch SAVE_BATCH of epoch
SAVE_EPOCH, keeps training, and writes the final weights to ``PROJECT_DIR/final.pt``.
"""

from __future__ import annotations

import os
import sys

import torch
from torch.utils.data import DataLoader, TensorDataset

EPOCHS = 3


def build(accelerate_module, utils):
    """Model, optimizer, scheduler and loader, identically for both libraries (after set_seed(0))."""
    utils.set_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.3), torch.nn.Linear(8, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)
    data = TensorDataset(torch.randn(10, 4), torch.randn(10, 1))
    loader = DataLoader(data, batch_size=3, shuffle=True)
    return model, optimizer, scheduler, loader


def step(accelerator, model, optimizer, scheduler, batch) -> None:
    x, y = batch
    loss = torch.nn.functional.mse_loss(model(x), y)
    accelerator.backward(loss)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()


def main() -> None:
    import accelerate
    import accelerate.utils as utils

    project, save_epoch, save_batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    model, optimizer, scheduler, loader = build(accelerate, utils)
    config = utils.ProjectConfiguration(project_dir=project, automatic_checkpoint_naming=True)
    accelerator = accelerate.Accelerator(cpu=True, project_config=config)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    for epoch in range(EPOCHS):
        for i, batch in enumerate(loader):
            step(accelerator, model, optimizer, scheduler, batch)
            if (epoch, i) == (save_epoch, save_batch):
                accelerator.save_state(safe_serialization=os.environ.get("SAFE", "1") == "1")
    torch.save(accelerator.unwrap_model(model).state_dict(), os.path.join(project, "final.pt"))


if __name__ == "__main__":
    main()
