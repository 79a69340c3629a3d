"""Checkpointing: crash-safe ``save_state`` / ``load_state`` and the public checkpoint helpers.

A checkpoint folder is either complete and verifiable (it has a manifest with every file's size and
checksum) or invisible (a hidden staging folder). Modules:

- ``atomic``: staging, durability, manifest, atomic rename, rotation, listing, verification;
- ``files`` / ``state_io`` / ``rng``: the state files and how each kind of state is written and read;
- ``public``: ``save_accelerator_state`` & co. in the seed's and the reference's forms;
- ``orchestrate``: the multi-process protocol behind ``Accelerator.save_state`` / ``load_state``.
"""

from __future__ import annotations

from accelerando.checkpointing.atomic import CheckpointError, list_checkpoints, verify_checkpoint
from accelerando.checkpointing.orchestrate import (
    ResumePoint,
    latest_checkpoint,
    load_state,
    resume_point,
    save_state,
)
from accelerando.checkpointing.public import (
    load_accelerator_state,
    load_custom_state,
    save_accelerator_state,
    save_custom_state,
    set_active_accelerator,
)

__all__ = [
    "CheckpointError",
    "ResumePoint",
    "latest_checkpoint",
    "list_checkpoints",
    "load_accelerator_state",
    "load_custom_state",
    "load_state",
    "resume_point",
    "save_accelerator_state",
    "save_custom_state",
    "save_state",
    "set_active_accelerator",
    "verify_checkpoint",
]
