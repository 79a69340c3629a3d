"""Trackio tracker: a local-first, W&B-compatible tracker."""

from __future__ import annotations

from accelerando.backends.trackers.base import (
    LibraryRunTracker,
    on_main_process,
    sanitize_config,
)

__all__ = ["TrackioTracker"]


class TrackioTracker(LibraryRunTracker):
    """Log to a Trackio run.

    Args:
        run_name: the Trackio project name.
        **kwargs: passed to ``trackio.init`` (``name``, ``space_id``, ...).
    """

    name = "trackio"
    module_name = "trackio"

    @on_main_process
    def store_init_configuration(self, values: dict[str, object]) -> None:
        """Add the configuration to the run's config.

        Args:
            values: the configuration.
        """
        import trackio

        trackio.config.update(sanitize_config(values))

    @on_main_process
    def log(self, values: dict[str, object], step: int | None = None, **kwargs: object) -> None:
        """Log values with ``trackio.log``.

        Args:
            values: name -> number.
            step: the global step.
            **kwargs: passed to ``trackio.log``.
        """
        import trackio

        trackio.log(values, step=step, **kwargs)

    @on_main_process
    def finish(self) -> None:
        """Finish the run."""
        if self._tracker is not None:
            import trackio

            trackio.finish()
