"""DVCLive tracker: metrics, params and plots as plain files (``dvclive/`` by default)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from accelerando.backends.trackers.base import (
    CHECKPOINT_SIZE_KEY,
    GeneralTracker,
    missing_library_error,
    on_main_process,
    sanitize_config,
    scalar_value,
)
from accelerando.logging import get_logger

if TYPE_CHECKING:
    from dvclive.live import Live

__all__ = ["DVCLiveTracker"]

logger = get_logger(__name__)


class DVCLiveTracker(GeneralTracker):
    """Log through a ``dvclive.Live`` object.

    Args:
        run_name: kept for symmetry with the other trackers (DVCLive names experiments itself).
        live: an existing ``dvclive.Live`` to reuse; otherwise one is created at ``start``.
        logging_dir: when given (and ``dir`` is not), files go to ``<logging_dir>/dvclive``.
        **kwargs: passed to ``dvclive.Live`` (``dir``, ``save_dvc_exp``, ``report``, ...).
    """

    name = "dvclive"
    requires_logging_directory = False

    def __init__(
        self,
        run_name: str | None = None,
        live: Live | None = None,
        logging_dir: str | os.PathLike[str] | None = None,
        **kwargs: Any,  # dvclive.Live's own keyword parameters, each with its type
    ) -> None:
        super().__init__()
        self.run_name = run_name
        self._live = live
        if logging_dir is not None:
            kwargs.setdefault("dir", os.path.join(os.fspath(logging_dir), "dvclive"))
        self._kwargs = kwargs

    @on_main_process
    def start(self) -> None:
        """Create (or adopt) the ``Live`` object."""
        if self._live is None:
            try:
                from dvclive.live import Live
            except ImportError as exc:
                raise missing_library_error(self.name, "dvclive") from exc
            self._live = Live(**self._kwargs)
        self._tracker = self._live

    @property
    def live(self) -> Live | None:
        """The ``dvclive.Live`` object (same as ``tracker``)."""
        return self._tracker

    @on_main_process
    def store_init_configuration(self, values: dict[str, object]) -> None:
        """Store the configuration with ``Live.log_params``.

        Args:
            values: the configuration.
        """
        self._tracker.log_params(sanitize_config(values))

    @on_main_process
    def log(self, values: dict[str, object], step: int | None = None, **kwargs: object) -> None:
        """Log numbers and strings with ``Live.log_metric`` at ``step`` and advance DVCLive's step.

        Args:
            values: name -> number or string (other values are skipped with a warning).
            step: the global step (DVCLive's own counter is used when ``None``).
            **kwargs: passed to ``Live.log_metric``.
        """
        live = self._tracker
        if step is not None:
            live.step = step
        for key, raw in values.items():
            value = scalar_value(raw)
            if isinstance(value, (int, float, str)):
                live.log_metric(key, value, **kwargs)
            else:
                logger.warning_once(
                    f"DVCLiveTracker: skipped {key!r}; DVCLive metrics must be numbers or strings."
                )
        live.next_step()

    @on_main_process
    def log_checkpoint(self, step: int | None, path: str, size_bytes: int) -> None:
        """Log the checkpoint size at ``step`` without moving DVCLive's step counter (no ``next_step``).

        Args:
            step: the script's step; None: DVCLive's current step (the row the script writes next).
            path: the checkpoint folder (unused).
            size_bytes: its total size on disk.
        """
        live = self._tracker
        current = live.step
        if step is not None:
            live.step = step
        try:
            live.log_metric(CHECKPOINT_SIZE_KEY, int(size_bytes))
        finally:
            live.step = current  # the script's next ``log`` continues where it left off

    @on_main_process
    def finish(self) -> None:
        """End the DVCLive session (writes the summary)."""
        if self._tracker is not None:
            self._tracker.end()
