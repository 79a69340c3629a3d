"""Neptune tracker (``neptune`` 1.x); ``mode="offline"`` or ``"debug"`` runs without a server."""

from __future__ import annotations

from accelerando.backends.trackers.base import (
    LibraryRunTracker,
    on_main_process,
    sanitize_config,
    scalar_value,
)
from accelerando.logging import get_logger

__all__ = ["NeptuneTracker"]

logger = get_logger(__name__)


def _neptune_safe(node: object) -> object:
    # Neptune namespaces accept nested dicts of str/int/float/bool but not lists or None.
    if isinstance(node, dict):
        return {key: _neptune_safe(value) for key, value in node.items()}
    if node is None or isinstance(node, list):
        return str(node)
    return node


class NeptuneTracker(LibraryRunTracker):
    """Log to a Neptune run.

    Args:
        run_name: the run's display name.
        **kwargs: passed to ``neptune.init_run`` (``project``, ``mode``, ``api_token``, ...).
    """

    name = "neptune"
    module_name = "neptune"
    init_function = "init_run"
    project_keyword = "name"

    @on_main_process
    def store_init_configuration(self, values: dict[str, object]) -> None:
        """Store the configuration under the run's ``parameters`` namespace.

        Args:
            values: the configuration.
        """
        self._tracker["parameters"] = _neptune_safe(sanitize_config(values))

    @on_main_process
    def log(self, values: dict[str, object], step: int | None = None, **kwargs: object) -> None:
        """Append each value to the series of the same name.

        Args:
            values: name -> number or str.
            step: the global step.
            **kwargs: passed to ``append``.
        """
        for key, raw in values.items():
            value = scalar_value(raw)
            if isinstance(value, (int, float, str)):
                self._tracker[key].append(value, step=step, **kwargs)
            else:
                logger.warning_once(f"NeptuneTracker: skipped {key!r}; only numbers and strings are logged.")

    @on_main_process
    def finish(self) -> None:
        """Stop the run (flushes pending data)."""
        if self._tracker is not None:
            self._tracker.stop()
