"""Automatic resume (setting ``auto_resume``): the documented resume pattern, built into ``prepare``.

The first ``prepare()`` call, once it has registered its objects, loads the newest complete checkpoint
of the project folder (``<project_dir>/checkpoints``, automatically named checkpoints; damaged ones
are skipped as ``load_state()`` does) and makes each prepared dataloader start its next iteration
where the checkpoint's run stood: the epoch (``len``-independent, the loader's own epoch counter) and
the batches already given out in it. Prepare every object in that first call (the usual
``model, optimizer, dataloader, scheduler = accelerator.prepare(...)``); a script's own epoch loop
starts at ``accelerator.resume_point.epoch`` (``resume_point`` is None on a fresh start). Objects
registered with ``register_for_checkpointing`` after that ``prepare()`` are restored when registered,
from the same checkpoint (the i-th registered object from ``custom_checkpoint_<i>.pkl``).

With ``accelerando launch --max_restarts N`` a run whose worker died restarts from its last
checkpoint and, saving every k steps, ends with the same weights as an uninterrupted run.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from accelerando.facade.checkpoint_service import CheckpointService

__all__ = ["resume_on_prepare"]

logger = logging.getLogger(__name__)


def resume_on_prepare(checkpoints: CheckpointService) -> str | None:
    """Load the newest complete checkpoint through ``checkpoints`` and position the prepared dataloaders.

    Returns:
        The folder loaded, or None when the project has no checkpoint yet (a fresh start).

    Raises:
        ValueError: If the project has no automatically named checkpoints.
        CheckpointError: If every checkpoint of the project is damaged (see ``load_state``).
    """
    from accelerando.checkpointing.project import RESUME_POINT, latest_checkpoint

    config = checkpoints.project_configuration
    if not config.automatic_checkpoint_naming or config.project_dir is None:
        raise ValueError(
            "auto_resume needs a project folder with automatically named checkpoints: pass "
            "project_config=ProjectConfiguration(project_dir=..., automatic_checkpoint_naming=True)."
        )
    if latest_checkpoint(config.project_dir) is None:
        logger.info("auto_resume: no checkpoint under %s, starting fresh", config.project_dir)
        return None
    checkpoints.load_state()
    point = checkpoints.target.memory.peek(RESUME_POINT)
    if point is None:  # load_state records a resume point; nothing recorded means nothing to position
        return None
    # Objects registered later (register_for_checkpointing after prepare) are restored from here too.
    checkpoints.resumed_from = point.checkpoint
    for loader, (_, position) in zip(checkpoints.registry.dataloaders, point.dataloaders, strict=False):
        resume_at = getattr(loader, "resume_at", None)  # every prepared loader has it
        if resume_at is not None:
            resume_at(position)
    if checkpoints.state.is_main_process:
        logger.warning(
            "auto_resume: resumed from %s (epoch %d, %d batches into it)",
            point.checkpoint,
            point.epoch,
            point.dataloaders[0][1] if point.dataloaders else 0,
        )
    return point.checkpoint
