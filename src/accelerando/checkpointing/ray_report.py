"""Report each committed checkpoint to Ray Train, when the script runs inside a Ray Train worker.

Called by every process right after a synchronous ``save_state`` commits (the hook point in
:func:`accelerando.checkpointing.save.save_state_sync`). Outside a Ray Train ``train_func`` it does
nothing and imports nothing. Inside one, each process calls ``ray.train.report`` once per save (Ray
requires every worker to call it the same number of times: it is a barrier); rank 0 passes the
committed folder as a ``ray.train.Checkpoint``, which Ray copies to the run's storage
(``RunConfig(storage_path=..., name=...)``) under the checkpoint's own name, ``checkpoint_<n>``. The
other ranks pass none: the folder is already complete (the commit is collective), one copy is enough.

The metrics reported are ``{"step": <step>, "checkpoint": <name>}``; Ray keeps them with the checkpoint.
"""

from __future__ import annotations

import os

from accelerando.checkpointing.target import CheckpointTarget
from accelerando.core.runtime import current_process

__all__ = ["report_to_ray"]


def report_to_ray(target: CheckpointTarget, path: str) -> bool:
    """Report the checkpoint committed at ``path`` to Ray Train (every process calls this once per save).

    Args:
        target: the saving Accelerator's checkpoint target (its ``step`` is reported).
        path: the committed checkpoint folder.

    Returns:
        True when reported (this process is a Ray Train worker), False otherwise.

    Raises:
        RuntimeError: from Ray, when the report fails (e.g. the storage cannot be written).
    """
    context = current_process()
    if context is None or context.cluster.name != "ray_train":
        return False
    import ray.train

    name = os.path.basename(os.path.normpath(path))
    checkpoint = ray.train.Checkpoint.from_directory(path) if context.cluster.rank == 0 else None
    ray.train.report(
        {"step": int(target.step), "checkpoint": name}, checkpoint=checkpoint, checkpoint_dir_name=name
    )
    return True
