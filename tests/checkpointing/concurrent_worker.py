"""Training runs started by tests/checkpointing/test_concurrent_runs.py in fresh processes (no tests here).

Each run saves a tiny model into a shared project folder again and again. What it saves is marked with
its run id: every parameter is ``run * 1000 + save`` and a registered :class:`Mark` holds
``(run, save)``, so a checkpoint that mixes two runs' files is told apart from one run's.
"""

from __future__ import annotations

import json
import os
import time


class Mark:
    """Registered for checkpointing: which run saved, and which of its saves."""

    def __init__(self, run: int = 0) -> None:
        self.run = run
        self.save = -1

    def state_dict(self) -> dict[str, int]:
        return {"run": self.run, "save": self.save}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.run, self.save = int(state["run"]), int(state["save"])


def forkserver_context():
    """A multiprocessing context whose fork server has torch and accelerando preloaded."""
    import multiprocessing as mp

    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torch.optim", "accelerando", "accelerando.accelerator"])
    return ctx


def build(project: str, run: int):
    """Accelerator (automatic naming, total_limit=2), a small model and optimizer, and the mark."""
    import torch

    from accelerando import Accelerator
    from accelerando.plugins.project import ProjectConfiguration

    accelerator = Accelerator(
        cpu=True,
        project_config=ProjectConfiguration(
            project_dir=project, automatic_checkpoint_naming=True, total_limit=2
        ),
    )
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Linear(32, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    model(torch.randn(2, 32)).sum().backward()
    optimizer.step()  # the optimizer has state to save
    mark = Mark(run)
    accelerator.register_for_checkpointing(mark)
    return accelerator, accelerator.unwrap_model(model), mark


def saver(
    project: str,
    run: int,
    saves: int,
    log: str,
    wait_for_lock: float | None = None,
    ready=None,
    first_saved=None,
    go=None,
    linger=None,
    wait_slice: float | None = None,
    rank: int = 0,
) -> None:
    """Save ``saves`` times (stopping at a refusal), recording every outcome as JSON in ``<log>.<rank>``.

    The optional Events let the parent interleave two runs: ``ready`` is set just before the first
    save, ``first_saved`` after it; ``go`` is awaited after the first save and ``linger`` before the
    process ends (a run holds the project lock until then). ``wait_slice`` shortens the rounds in which
    the processes of a waiting run meet.
    """
    import torch

    from accelerando.checkpointing import save as save_module
    from accelerando.checkpointing.lock import CheckpointLockedError

    if wait_slice is not None:
        save_module._WAIT_SLICE_S = wait_slice

    accelerator, model, mark = build(project, run)
    events = []
    if ready is not None and accelerator.is_main_process:
        ready.set()
    for save in range(saves):
        mark.save = save
        with torch.no_grad():
            for param in model.parameters():
                param.fill_(float(run * 1000 + save))
        start = time.time()
        try:
            path = accelerator.save_state(wait_for_lock=wait_for_lock)
        except CheckpointLockedError as err:
            events.append({"refused": str(err), "at": time.time()})
            break
        events.append({"saved": path, "save": save, "took": time.time() - start, "at": time.time()})
        if save == 0:
            if first_saved is not None:
                first_saved.set()
            if go is not None:
                assert go.wait(timeout=120), "never told to go on"
    accelerator.wait_for_everyone()
    if linger is not None:
        assert linger.wait(timeout=120), "never told to end"
    with open(f"{log}.{rank}", "w") as handle:
        json.dump({"pid": os.getpid(), "events": events, "exit": time.time()}, handle)


def rank_saver(rank: int, world_size: int, port: int, *args, **kwargs) -> None:
    """:func:`saver` as rank ``rank`` of ``world_size`` (torchrun-style environment, gloo)."""
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
    saver(*args, **kwargs, rank=rank)


def hold_lock_then_sleep(project: str, ready, fork_child: bool, child_pid) -> None:
    """Take the project lock through a save, optionally fork a child that outlives us, then sleep."""
    accelerator, _, _ = build(project, 9)
    accelerator.save_state()
    if fork_child:
        pid = os.fork()
        if pid == 0:  # the child: keeps every descriptor it inherited, sleeps, never returns
            time.sleep(60)
            os._exit(0)
        child_pid.value = pid
    ready.set()
    time.sleep(60)
