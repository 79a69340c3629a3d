"""ProjectConfiguration: where a run writes its checkpoints and logs, and how checkpoints are named."""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = ["ProjectConfiguration"]


@dataclass
class ProjectConfiguration:
    """Where a run keeps its files and how ``Accelerator.save_state`` names and rotates checkpoints.

    With ``automatic_checkpoint_naming`` every ``save_state()`` without a folder writes
    ``<project_dir>/checkpoints/checkpoint_<iteration>`` and then increments ``iteration``;
    ``load_state()`` without a folder resumes from the newest complete checkpoint there and sets
    ``iteration`` to the number after it.

    Args:
        project_dir: Root folder of the run (checkpoints go under ``<project_dir>/checkpoints``).
        logging_dir: Folder for tracker logs; defaults to ``project_dir``.
        automatic_checkpoint_naming: Name checkpoints ``checkpoint_<n>`` automatically.
        total_limit: Keep at most this many automatically named checkpoints; older ones are deleted
            only after a newer one is complete. ``None`` keeps them all.
        iteration: Number of the next automatically named checkpoint.
        save_on_each_node: Write the process-shared files on every node's local main process
            (for nodes that do not share a file system) instead of only on the global main process.
        async_save: ``save_state()`` copies the state to host memory and writes and commits it in a
            background thread, returning a handle whose ``result()`` waits for the commit (see
            :mod:`accelerando.checkpointing.async_save`); ``save_state(async_save=...)`` overrides it.
            Parameters and optimizer state are copied in the background too, the prepared optimizers'
            next ``step()`` waiting for that copy: until then change parameters only through them, or
            pass ``save_state(async_save=True, overlap_snapshot=False)`` to copy everything first.

    Raises:
        ValueError: If ``total_limit`` is not a positive integer or ``iteration`` is negative.

    Example:
        >>> config = ProjectConfiguration(project_dir="runs/a", automatic_checkpoint_naming=True, total_limit=3)
        >>> config.logging_dir
        'runs/a'
    """

    project_dir: str | None = None
    logging_dir: str | None = None
    automatic_checkpoint_naming: bool = False
    total_limit: int | None = None
    iteration: int = 0
    save_on_each_node: bool = False
    async_save: bool = False

    def __post_init__(self) -> None:
        if self.total_limit is not None and (
            isinstance(self.total_limit, bool)
            or not isinstance(self.total_limit, int)
            or self.total_limit < 1
        ):
            raise ValueError(
                f"ProjectConfiguration.total_limit must be a positive integer or None, got {self.total_limit!r}; "
                "pass e.g. total_limit=3 to keep the three newest checkpoints, or None to keep all."
            )
        if isinstance(self.iteration, bool) or not isinstance(self.iteration, int) or self.iteration < 0:
            raise ValueError(
                f"ProjectConfiguration.iteration must be a non-negative integer, got {self.iteration!r}; "
                "it is the number of the next automatically named checkpoint (start at 0)."
            )
        self.set_directories(self.project_dir)

    def set_directories(self, project_dir: str | os.PathLike | None = None) -> None:
        """Set ``project_dir``, and ``logging_dir`` too when it was not given.

        Args:
            project_dir: The new project folder (``None`` leaves the run without one).
        """
        self.project_dir = None if project_dir is None else os.fspath(project_dir)
        if self.logging_dir is None:
            self.logging_dir = self.project_dir
        else:
            self.logging_dir = os.fspath(self.logging_dir)
