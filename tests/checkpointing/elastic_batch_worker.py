"""Rank functions for test_elastic_batch.py (spawned by run_distributed: module level, picklable)."""

from __future__ import annotations

import logging
import os

import torch

FEATURES = 6
PER_PROCESS_BATCH = 4


def _sample_batch(first: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Samples ``first .. first+count-1`` of a fixed data stream (each a pure function of its index)."""
    rows = []
    for index in range(first, first + count):
        gen = torch.Generator().manual_seed(1000 + index)
        rows.append(torch.randn(FEATURES + 1, generator=gen))
    data = torch.stack(rows)
    return data[:, :FEATURES], data[:, FEATURES:]


def _build(accumulation: int, elastic_batch: str | None) -> tuple[object, object, object, object]:
    from accelerando import Accelerator

    kwargs = {"elastic_batch": elastic_batch} if elastic_batch else {}
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=accumulation, **kwargs)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(FEATURES, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda count: 1.0 / (1 + 0.1 * count))
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    return accelerator, model, optimizer, scheduler


def _optimizer_step(accelerator, model, optimizer, scheduler, step: int) -> float:
    """One optimizer step over global samples [step * G, (step + 1) * G), G = the global batch.

    Each micro-batch takes a contiguous slice; the loss returned is the mean over the global batch.
    """
    world, rank = accelerator.num_processes, accelerator.process_index
    cycle = accelerator.gradient_accumulation_steps
    global_batch = PER_PROCESS_BATCH * world * cycle
    total = torch.zeros(())
    for micro in range(cycle):
        first = step * global_batch + (micro * world + rank) * PER_PROCESS_BATCH
        inputs, targets = _sample_batch(first, PER_PROCESS_BATCH)
        with accelerator.accumulate(model):
            loss = torch.nn.functional.mse_loss(model(inputs), targets)
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
        total += loss.detach()
    return float(accelerator.reduce(total / cycle, "mean"))


def train(
    accumulation: int,
    steps: int,
    folder: str | None,
    save_after: int | None,
    resume: bool,
    elastic_batch: str | None = None,
    start_step: int = 0,
) -> dict[str, object]:
    """Train ``steps`` optimizer steps (saving after ``save_after`` of them, or resuming first)."""
    records: list[logging.LogRecord] = []

    class _Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    logging.getLogger("accelerando").addHandler(_Keep(logging.WARNING))
    accelerator, model, optimizer, scheduler = _build(accumulation, elastic_batch)
    if resume:
        assert folder is not None
        accelerator.load_state(folder)
    losses: list[float] = []
    lrs: list[float] = []
    for step in range(start_step, start_step + steps):
        losses.append(_optimizer_step(accelerator, model, optimizer, scheduler, step))
        lrs.append(float(scheduler.get_last_lr()[0]))
        if save_after is not None and step + 1 == save_after:
            assert folder is not None
            accelerator.save_state(folder)
    return {
        "losses": losses,
        "lrs": lrs,
        "accumulation": accelerator.gradient_accumulation_steps,
        "messages": [r.getMessage() for r in records],
        "weights": [p.detach().clone() for p in accelerator.unwrap_model(model).parameters()],
    }


def rng_draws(folder: str, save: bool) -> dict[str, object]:
    """Save after seeding per rank, or load and draw: what each process's generators give next."""
    import random

    import numpy as np

    from accelerando import Accelerator

    accelerator = Accelerator(cpu=True)
    rank = accelerator.process_index
    torch.manual_seed(100 + rank)
    random.seed(200 + rank)
    np.random.seed(300 + rank)
    model = accelerator.prepare(torch.nn.Linear(2, 2))
    del model
    if save:
        accelerator.save_state(folder)
    else:
        accelerator.load_state(folder)
    return {
        "rank": rank,
        "torch": torch.rand(3).tolist(),
        "python": [random.random() for _ in range(3)],
        "numpy": np.random.rand(3).tolist(),
        "pid": os.getpid(),
    }


def train_from_loader(
    accumulation: int,
    epochs_steps: int,
    folder: str,
    save_after: int | None,
    resume: bool,
    elastic: str | None,
) -> dict[str, object]:
    """Train from a prepared, shuffled DataLoader; resume with the documented pattern.

    ``load_state`` + ``skip_first_batches(loader, accelerator.resume_point.batches_to_skip)``; the loss
    recorded per optimizer step is the mean over every process's micro-batches of that step.
    """
    from torch.utils.data import DataLoader, TensorDataset

    accelerator, model, optimizer, scheduler = _build(accumulation, elastic)
    inputs, targets = _sample_batch(0, 96)
    loader = DataLoader(
        TensorDataset(inputs, targets),
        batch_size=PER_PROCESS_BATCH,
        shuffle=True,
        generator=torch.Generator().manual_seed(7),
    )
    loader = accelerator.prepare(loader)
    batches = loader
    if resume:
        accelerator.load_state(folder)
        point = accelerator.resume_point
        assert point is not None
        batches = accelerator.skip_first_batches(loader, point.batches_to_skip)
    losses: list[float] = []
    seen: list[float] = []
    total, count = torch.zeros(()), 0
    for x, y in batches:
        with accelerator.accumulate(model):
            loss = torch.nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
        seen.extend(accelerator.gather(x[:, 0].contiguous()).tolist())
        total, count = total + loss.detach(), count + 1
        if accelerator.sync_gradients:
            losses.append(float(accelerator.reduce(total / count, "mean")))
            total, count = torch.zeros(()), 0
            if save_after is not None and len(losses) == save_after:
                accelerator.save_state(folder)
        if len(losses) == epochs_steps:
            break
    return {"losses": losses, "seen": seen, "accumulation": accelerator.gradient_accumulation_steps}
