"""Weights & Biases tracker (``wandb``); offline runs work with ``mode="offline"``."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from accelerando.backends.trackers.base import (
    CHECKPOINT_SIZE_KEY,
    LibraryRunTracker,
    on_main_process,
    sanitize_config,
)

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["WandBTracker"]


class WandBTracker(LibraryRunTracker):
    """Log to a Weights & Biases run.

    Args:
        run_name: the W&B project name.
        **kwargs: passed to ``wandb.init`` (``mode="offline"``, ``dir``, ``entity``, ``name``, ...).
    """

    name = "wandb"
    module_name = "wandb"

    @on_main_process
    def store_init_configuration(self, values: dict[str, object]) -> None:
        """Store the configuration in the run's config.

        Args:
            values: the configuration (converted with ``sanitize_config``).
        """
        self._tracker.config.update(sanitize_config(values), allow_val_change=True)

    @on_main_process
    def log(self, values: dict[str, object], step: int | None = None, **kwargs: object) -> None:
        """Log values with ``run.log``.

        Args:
            values: name -> value (anything ``wandb`` accepts).
            step: the global step.
            **kwargs: passed to ``run.log`` (``commit``, ...).
        """
        self._tracker.log(values, step=step, **kwargs)

    @on_main_process
    def log_checkpoint(self, step: int | None, path: str, size_bytes: int) -> None:
        """Add the checkpoint size to the run's current history row (``commit=False``).

        A W&B history is one row per step and drops any row logged at a lower step than the last
        one, so the metric joins the row the script is writing rather than naming a step.

        Args:
            step: unused (see above).
            path: the checkpoint folder (unused).
            size_bytes: its total size on disk.
        """
        self._tracker.log({CHECKPOINT_SIZE_KEY: int(size_bytes)}, commit=False)

    @on_main_process
    def log_images(
        self,
        values: Mapping[str, Iterable[object]],
        step: int | None = None,
        **kwargs: Any,  # wandb.Image's own keyword parameters, each with its type
    ) -> None:
        """Log lists of images as ``wandb.Image``.

        Args:
            values: name -> iterable of images (arrays, tensors or PIL images).
            step: the global step.
            **kwargs: passed to ``wandb.Image``.
        """
        import wandb

        self._tracker.log(
            {key: [wandb.Image(img, **kwargs) for img in imgs] for key, imgs in values.items()}, step=step
        )

    @on_main_process
    def log_table(
        self,
        table_name: str,
        columns: list[str] | None = None,
        data: list[list[object]] | None = None,
        dataframe: pd.DataFrame | None = None,
        step: int | None = None,
        **kwargs: object,
    ) -> None:
        """Log a table, from ``columns`` + ``data`` rows or from a pandas ``dataframe``.

        Args:
            table_name: the key of the table in the run.
            columns: column names (with ``data``).
            data: rows (with ``columns``).
            dataframe: a pandas DataFrame instead of ``columns``/``data``.
            step: the global step.
            **kwargs: passed to ``run.log``.
        """
        import wandb

        # wandb types its columns as str | int keys and its rows as iterables: the same lists, widened.
        header: list[str | int] | None = None if columns is None else list(columns)
        rows: list[Iterable[object]] | None = None if data is None else list(data)
        table = wandb.Table(columns=header, data=rows, dataframe=dataframe)
        self._tracker.log({table_name: table}, step=step, **kwargs)

    @on_main_process
    def finish(self) -> None:
        """Finish the run (syncs or closes the offline files)."""
        if self._tracker is not None:
            self._tracker.finish()
