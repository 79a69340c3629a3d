"""Training script run by the checkpoint tests in fresh processes (no tests in this module).

It follows the documented auto-resume pattern: if the project holds a complete checkpoint, load it
and continue from the restored position; otherwise start fresh. ``--kill-at k`` saves a checkpoint
after micro-step k and then kills its own process with SIGKILL, like a crash.

Usage: python tests/test_checkpoint_worker.py PROJECT OUT [--steps N] [--kill-at K] [--stateful]
(also under ``torch.distributed.run`` with several processes).
"""

from __future__ import annotations

import argparse
import os
import random
import signal

import numpy as np
import torch


def forkserver_context():
    """A multiprocessing context whose fork server has torch and this module preloaded: each process a
    test starts then costs a fork, not an interpreter start and imports."""
    import multiprocessing as mp

    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(
        [
            "torch",
            "torch._dynamo",
            "torch.optim",
            "accelerando",
            "accelerando.accelerator",
            "test_checkpoint_worker",
        ]
    )
    return ctx


class Progress:
    """The script's own counter of micro-steps, registered for checkpointing."""

    def __init__(self) -> None:
        self.micro_steps = 0

    def state_dict(self) -> dict[str, int]:
        return {"micro_steps": self.micro_steps}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.micro_steps = int(state["micro_steps"])


def build(project: str, stateful: bool, own_generator: bool = True):
    """Seeded model (with dropout), AdamW, scheduler, shuffled dataloader, accumulation of 2."""
    from accelerando import Accelerator
    from accelerando.plugins.project import ProjectConfiguration

    torch.manual_seed(0)
    np.random.seed(0)
    random.seed(0)
    kwargs = {}
    if stateful:
        from accelerando import DataLoaderConfiguration

        kwargs["dataloader_config"] = DataLoaderConfiguration(use_stateful_dataloader=True)
    accelerator = Accelerator(
        cpu=True,
        gradient_accumulation_steps=2,
        project_config=ProjectConfiguration(
            project_dir=project, automatic_checkpoint_naming=True, total_limit=2
        ),
        **kwargs,
    )
    data = torch.utils.data.TensorDataset(torch.randn(48, 4), torch.randn(48, 1))
    loader = torch.utils.data.DataLoader(
        data,
        batch_size=4,
        shuffle=True,
        generator=torch.Generator().manual_seed(0) if own_generator else None,
    )
    model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Dropout(0.2), torch.nn.Linear(16, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 / (1 + s))
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    return accelerator, model, optimizer, loader, scheduler


def train(
    project: str,
    out: str,
    steps: int,
    kill_at: int,
    stateful: bool,
    own_generator: bool = True,
    mapped_loads: bool = False,
) -> None:
    from accelerando.checkpointing import latest_checkpoint, resume_point

    if mapped_loads:  # read even this small optimizer file through a memory map, as big ones are
        from accelerando.checkpointing import files

        files.MAPPED_LOAD_MIN_BYTES = 1

    accelerator, model, optimizer, loader, scheduler = build(project, stateful, own_generator)
    progress = Progress()
    accelerator.register_for_checkpointing(progress)
    start_epoch, skip = 0, 0
    if latest_checkpoint(project):
        accelerator.load_state()
        point = resume_point(accelerator)
        start_epoch, skip = point.epoch, point.batches_to_skip
    epoch = start_epoch
    while progress.micro_steps < steps:
        loader.set_epoch(epoch)
        batches = accelerator.skip_first_batches(loader, skip) if skip else loader
        skip = 0
        for x, y in batches:
            with accelerator.accumulate(model):
                loss = torch.nn.functional.mse_loss(model(x), y)
                accelerator.backward(loss)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            progress.micro_steps += 1
            if progress.micro_steps == kill_at:
                accelerator.save_state()
                os.kill(os.getpid(), signal.SIGKILL)
            if progress.micro_steps == steps:
                break
        epoch += 1
    if accelerator.is_main_process:
        unwrapped = accelerator.unwrap_model(model)
        torch.save({"params": unwrapped.state_dict(), "optimizer": optimizer.state_dict()}, out)
    accelerator.wait_for_everyone()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("project")
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--kill-at", type=int, default=-1)
    parser.add_argument("--stateful", action="store_true")
    args = parser.parse_args()
    train(args.project, args.out, args.steps, args.kill_at, args.stateful)


if __name__ == "__main__":
    main()


def saver_loop(project: str, log_path: str, ready, pause: str | None) -> None:
    """Resume from the newest checkpoint (logging what was found), then save over and over until killed.

    Before each save every parameter is set to the number of the checkpoint being written, so a
    resumed process can tell which checkpoint it loaded. ``pause`` ("rmtree" or "fsync") stalls the
    process inside rotation or inside the flush of a save and signals ``ready``, so that the parent
    kills it exactly there; otherwise ``ready`` is set when the saving loop starts.
    """
    import torch

    from accelerando import Accelerator
    from accelerando.checkpointing import atomic, latest_checkpoint
    from accelerando.plugins.project import ProjectConfiguration

    accelerator = Accelerator(
        cpu=True,
        project_config=ProjectConfiguration(
            project_dir=project, automatic_checkpoint_naming=True, total_limit=2
        ),
    )
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 8))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    model(torch.randn(2, 64)).sum().backward()
    optimizer.step()
    with open(log_path, "a") as log:
        if latest_checkpoint(project):
            accelerator.load_state()
            loaded = accelerator.project_configuration.iteration - 1
            values = {float(v) for p in model.parameters() for v in p.detach().flatten()}
            log.write(f"resumed {loaded} {'ok' if values == {float(loaded)} else 'bad'}\n")
        else:
            log.write("fresh\n")
        log.flush()
        _install_pause(atomic, pause, ready)
        if pause is None:
            ready.set()
        while True:
            with torch.no_grad():
                for param in model.parameters():
                    param.fill_(float(accelerator.project_configuration.iteration))
            path = accelerator.save_state()
            log.write(f"committed {os.path.basename(path).split('_')[-1]}\n")
            log.flush()
            os.fsync(log.fileno())


def _install_pause(atomic, pause: str | None, ready) -> None:
    """Make the child stall (after signalling) inside rotation's delete or a save's flush."""
    import time

    if pause == "rmtree":
        from accelerando.checkpointing import removal  # rotation's deletes run there

        original_rmtree = removal.remove_tree

        def slow_rmtree(path, *args, **kwargs):
            if (
                ".trash-" in os.path.basename(path)
                and os.path.basename(os.path.dirname(path)) == "checkpoints"
            ):
                names = sorted(os.listdir(path))
                if names:
                    os.remove(os.path.join(path, names[0]))  # half-deleted when the kill lands
                ready.set()
                time.sleep(5)
            original_rmtree(path, *args, **kwargs)

        removal.remove_tree = slow_rmtree
    elif pause == "fsync":
        original_fsync = atomic.fsync_file
        calls = {"n": 0}

        def slow_fsync(path):
            calls["n"] += 1
            if calls["n"] > 3:  # inside a later save, with some files already flushed
                ready.set()
                time.sleep(5)
            original_fsync(path)

        atomic.fsync_file = slow_fsync


def rank_entry(rank: int, world_size: int, port: int, args: tuple) -> None:
    """Run :func:`train` as rank ``rank`` of ``world_size`` (torchrun-style environment, gloo)."""
    rank_call(rank, world_size, port, "train", args)


def rank_call(rank: int, world_size: int, port: int, name: str, args: tuple) -> None:
    """Run ``globals()[name](*args)`` as rank ``rank`` of ``world_size``."""
    if world_size > 1:
        os.environ.update(
            {
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),
                "WORLD_SIZE": str(world_size),
                "LOCAL_WORLD_SIZE": str(world_size),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
            }
        )
    globals()[name](*args)


def _small_run(project: str):
    import torch

    from accelerando import Accelerator
    from accelerando.plugins.project import ProjectConfiguration

    accelerator = Accelerator(
        cpu=True, project_config=ProjectConfiguration(project_dir=project, automatic_checkpoint_naming=True)
    )
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    return accelerator, accelerator.unwrap_model(model)


def save_two(project: str) -> None:
    """Save checkpoints 0 (weights 1.0) and 1 (weights 2.0) from every rank."""
    import torch

    accelerator, model = _small_run(project)
    for value in (1.0, 2.0):
        with torch.no_grad():
            for param in model.parameters():
                param.fill_(value)
        accelerator.save_state()


def load_and_report(project: str, out_dir: str) -> None:
    """``load_state()`` and write what was loaded (weight value, iteration, warnings) per rank."""
    import json
    import warnings

    accelerator, model = _small_run(project)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        accelerator.load_state()
    report = {
        "value": float(next(model.parameters()).flatten()[0]),
        "iteration": accelerator.project_configuration.iteration,
        "warnings": [str(w.message) for w in caught],
    }
    with open(os.path.join(out_dir, f"rank_{accelerator.process_index}.json"), "w") as handle:
        json.dump(report, handle)
