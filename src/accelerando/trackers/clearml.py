"""ClearML tracker; call ``clearml.Task.set_offline(True)`` (or set ``CLEARML_OFFLINE_MODE=1``) to run offline."""

from __future__ import annotations

from typing import Any

from accelerando.logging import get_logger
from accelerando.trackers.base import (
    GeneralTracker,
    missing_library_error,
    on_main_process,
    sanitize_config,
    scalar_value,
)

__all__ = ["ClearMLTracker"]

logger = get_logger(__name__)


def _title_series(key: str) -> tuple[str, str]:
    # ClearML plots group series under a title: "train/loss" -> plot "train", series "loss".
    title, sep, series = key.partition("/")
    return (title, series) if sep else (key, key)


class ClearMLTracker(GeneralTracker):
    """Log to a ClearML task (the current one if a task is already running).

    Args:
        run_name: the project name (``project_name``) and default task name.
        **kwargs: passed to ``clearml.Task.init``.
    """

    name = "clearml"
    requires_logging_directory = False

    def __init__(self, run_name: str | None = None, **kwargs: Any) -> None:
        super().__init__()
        self.run_name = run_name
        self._kwargs = kwargs
        self._owns_task = False

    @on_main_process
    def start(self) -> None:
        """Adopt the current task or create one with ``Task.init``."""
        try:
            from clearml import Task
        except ImportError as exc:
            raise missing_library_error(self.name, "clearml") from exc
        current = Task.current_task()
        if current is not None:
            self._tracker = current
            return
        self._kwargs.setdefault("project_name", self.run_name)
        self._kwargs.setdefault("task_name", self.run_name)
        self._tracker = Task.init(**self._kwargs)
        self._owns_task = True

    @on_main_process
    def store_init_configuration(self, values: dict[str, Any]) -> None:
        """Connect the configuration to the task.

        Args:
            values: the configuration.
        """
        self._tracker.connect_configuration(sanitize_config(values))

    @on_main_process
    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Report numbers as scalars (``title/series`` keys) or single values when ``step`` is None.

        Args:
            values: name -> number.
            step: the iteration.
            **kwargs: passed to ``report_scalar``.
        """
        clearml_logger = self._tracker.get_logger()
        for key, raw in values.items():
            value = scalar_value(raw)
            if not isinstance(value, (int, float)):
                logger.warning_once(f"ClearMLTracker: skipped {key!r}; only numbers are reported.")
            elif step is None:
                clearml_logger.report_single_value(name=key, value=value)
            else:
                title, series = _title_series(key)
                clearml_logger.report_scalar(
                    title=title, series=series, value=value, iteration=step, **kwargs
                )

    @on_main_process
    def finish(self) -> None:
        """Close the task if this tracker created it."""
        if self._tracker is not None and self._owns_task:
            self._tracker.close()
