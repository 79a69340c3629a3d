"""Checkpointing: crash-safe ``save_state`` / ``load_state`` and the public checkpoint helpers.

A checkpoint folder is either complete and verifiable (it has a manifest with every file's size and
checksum) or invisible (a hidden staging folder). Modules:

- ``atomic``: staging, durability, manifest, atomic rename, rotation, listing, verification;
- ``files`` / ``state_io`` / ``rng``: the state files and how each kind of state is written and read;
- ``public``: ``save_accelerator_state`` & co., folder-only and explicit;
- ``target``: the ``CheckpointTarget`` protocol, all that save/load see of the training;
- ``save`` / ``load``: the multi-process protocols behind ``Accelerator.save_state`` / ``load_state``;
- ``project``: the project folder's checkpoint numbering, the newest checkpoint, resume points.

Auto-resume pattern (re-running the same command after a crash continues where it stopped)::

    from accelerando import Accelerator
    from accelerando.checkpointing import latest_checkpoint, resume_point
    from accelerando.utils import ProjectConfiguration

    config = ProjectConfiguration(project_dir="runs/a", automatic_checkpoint_naming=True, total_limit=3)
    accelerator = Accelerator(project_config=config)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    accelerator.register_for_checkpointing(progress)  # e.g. your own step counter
    start_epoch, skip = 0, 0
    if latest_checkpoint(config.project_dir):  # None on the first run
        accelerator.load_state()  # newest complete checkpoint; damaged ones are skipped
        point = resume_point(accelerator)
        start_epoch, skip = point.epoch, point.batches_to_skip  # skip is 0 in stateful mode
    for epoch in range(start_epoch, num_epochs):
        loader.set_epoch(epoch)
        batches = accelerator.skip_first_batches(loader, skip) if skip else loader
        skip = 0
        for batch in batches:
            ...  # train; every N steps: accelerator.save_state()

For a bit-exact resume with ``shuffle=True``, give the DataLoader its own ``generator``. On another
number of processes the same pattern continues each prepared loader's global sample order: ``skip`` is
then counted in the new run's batches and lands on the exact sample the saved run stopped at.
"""

from __future__ import annotations

from accelerando.checkpointing.atomic import CheckpointError, list_checkpoints, verify_checkpoint
from accelerando.checkpointing.entry import save_state
from accelerando.checkpointing.files import UnsafeCheckpointError
from accelerando.checkpointing.load import load_state
from accelerando.checkpointing.lock import CheckpointLockedError
from accelerando.checkpointing.project import ResumePoint, latest_checkpoint, resume_point
from accelerando.checkpointing.public import (
    load_accelerator_state,
    load_custom_state,
    save_accelerator_state,
    save_custom_state,
)
from accelerando.common.constants import (
    MODEL_NAME,
    OPTIMIZER_NAME,
    RNG_STATE_NAME,
    SAFE_MODEL_NAME,
    SAFE_WEIGHTS_NAME,
    SAMPLER_NAME,
    SCALER_NAME,
    SCHEDULER_NAME,
    WEIGHTS_NAME,
)

__all__ = [
    "MODEL_NAME",
    "OPTIMIZER_NAME",
    "RNG_STATE_NAME",
    "SAFE_MODEL_NAME",
    "SAFE_WEIGHTS_NAME",
    "SAMPLER_NAME",
    "SCALER_NAME",
    "SCHEDULER_NAME",
    "WEIGHTS_NAME",
    "CheckpointError",
    "CheckpointLockedError",
    "ResumePoint",
    "UnsafeCheckpointError",
    "latest_checkpoint",
    "list_checkpoints",
    "load_accelerator_state",
    "load_custom_state",
    "load_state",
    "resume_point",
    "save_accelerator_state",
    "save_custom_state",
    "save_state",
    "verify_checkpoint",
]
