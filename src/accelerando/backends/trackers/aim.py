"""Aim tracker: a run in a local Aim repository (or a remote one by URL)."""

from __future__ import annotations

import os

from accelerando.backends.trackers.base import (
    GeneralTracker,
    missing_library_error,
    on_main_process,
    sanitize_config,
    scalar_value,
)
from accelerando.logging import get_logger

__all__ = ["AimTracker"]

logger = get_logger(__name__)


class AimTracker(GeneralTracker):
    """Track metrics and hyperparameters in an ``aim.Run``.

    Args:
        run_name: the run's experiment name.
        logging_dir: the Aim repository folder (created if missing) or ``aim://`` URL.
        **kwargs: passed to ``aim.Run``.
    """

    name = "aim"
    requires_logging_directory = True

    def __init__(
        self, run_name: str, logging_dir: str | os.PathLike[str] | None = ".", **kwargs: object
    ) -> None:
        super().__init__()
        self.run_name = run_name
        self.logging_dir = os.fspath(logging_dir if logging_dir is not None else ".")
        self._kwargs = kwargs

    @on_main_process
    def start(self) -> None:
        """Open the repository and create the run."""
        try:
            from aim import Run
        except ImportError as exc:
            raise missing_library_error(self.name, "aim") from exc
        self._kwargs.setdefault("experiment", self.run_name)
        self._tracker = Run(repo=self.logging_dir, **self._kwargs)
        self._tracker.name = self.run_name

    @on_main_process
    def store_init_configuration(self, values: dict[str, object]) -> None:
        """Store the configuration under the run's ``hparams`` key.

        Args:
            values: the configuration.
        """
        self._tracker["hparams"] = sanitize_config(values)

    @on_main_process
    def log(self, values: dict[str, object], step: int | None = None, **kwargs: object) -> None:
        """Track numeric values with ``Run.track``.

        Args:
            values: name -> number.
            step: the global step.
            **kwargs: passed to ``Run.track`` (``epoch``, ``context``).
        """
        for key, raw in values.items():
            value = scalar_value(raw)
            if isinstance(value, (int, float)):
                self._tracker.track(value, name=key, step=step, **kwargs)
            else:
                logger.warning_once(f"AimTracker: skipped {key!r}; only numbers are tracked.")

    @on_main_process
    def log_images(
        self, values: dict[str, object], step: int | None = None, kwargs: dict | None = None
    ) -> None:
        """Track images as ``aim.Image``.

        Args:
            values: name -> image, or name -> (image, caption).
            step: the global step.
            kwargs: ``{"aim_image": {...}, "track": {...}}`` options for ``aim.Image`` and ``Run.track``.
        """
        import aim

        options = kwargs or {}
        for key, value in values.items():
            image, caption = value if isinstance(value, tuple) else (value, "")
            aim_image = aim.Image(image, caption=caption, **options.get("aim_image", {}))
            self._tracker.track(aim_image, name=key, step=step, **options.get("track", {}))

    @on_main_process
    def finish(self) -> None:
        """Close the run."""
        if self._tracker is not None:
            self._tracker.close()
