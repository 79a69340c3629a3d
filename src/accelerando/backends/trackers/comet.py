"""Comet tracker (``comet_ml``); ``online=False`` in ``init_kwargs`` gives an offline experiment."""

from __future__ import annotations

from accelerando.backends.trackers.base import (
    LibraryRunTracker,
    on_main_process,
    sanitize_config,
    scalar_value,
)

__all__ = ["CometMLTracker"]


class CometMLTracker(LibraryRunTracker):
    """Log to a Comet experiment.

    Args:
        run_name: the Comet project name.
        **kwargs: passed to ``comet_ml.start`` (``online``, ``workspace``, ``experiment_config``, ...).
    """

    name = "comet_ml"
    module_name = "comet_ml"
    init_function = "start"
    project_keyword = "project_name"

    @on_main_process
    def store_init_configuration(self, values: dict[str, object]) -> None:
        """Log the configuration as experiment parameters.

        Args:
            values: the configuration.
        """
        self._tracker.log_parameters(sanitize_config(values))

    @on_main_process
    def log(self, values: dict[str, object], step: int | None = None, **kwargs: object) -> None:
        """Log numbers as metrics, strings as "other" values and dicts as grouped metrics.

        Args:
            values: name -> number, str or dict of numbers.
            step: the global step.
            **kwargs: passed to ``log_metric`` / ``log_other`` / ``log_metrics``.
        """
        experiment = self._tracker
        if step is not None:
            experiment.set_step(step)
        for key, raw in values.items():
            value = scalar_value(raw)
            if isinstance(value, (int, float)):
                experiment.log_metric(key, value, step=step, **kwargs)
            elif isinstance(value, str):
                experiment.log_other(key, value, **kwargs)
            elif isinstance(value, dict):
                experiment.log_metrics({k: scalar_value(v) for k, v in value.items()}, step=step, **kwargs)

    @on_main_process
    def finish(self) -> None:
        """End the experiment (writes the offline archive in offline mode)."""
        if self._tracker is not None:
            self._tracker.end()
