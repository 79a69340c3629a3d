"""SwanLab tracker; ``mode="offline"`` / ``"local"`` / ``"disabled"`` avoid the cloud."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from accelerando.backends.trackers.base import (
    LibraryRunTracker,
    on_main_process,
    sanitize_config,
)

__all__ = ["SwanLabTracker"]


class SwanLabTracker(LibraryRunTracker):
    """Log to a SwanLab run.

    Args:
        run_name: the SwanLab project name.
        **kwargs: passed to ``swanlab.init`` (``mode``, ``logdir``, ``experiment_name``, ...).
    """

    name = "swanlab"
    module_name = "swanlab"

    @on_main_process
    def store_init_configuration(self, values: dict[str, object]) -> None:
        """Add the configuration to the run's config.

        Args:
            values: the configuration.
        """
        import swanlab

        swanlab.config.update(sanitize_config(values))

    @on_main_process
    def log(self, values: dict[str, object], step: int | None = None, **kwargs: object) -> None:
        """Log values with ``run.log``.

        Args:
            values: name -> number (or SwanLab media object).
            step: the global step.
            **kwargs: passed to ``run.log``.
        """
        self._tracker.log(values, step=step, **kwargs)

    @on_main_process
    def log_images(
        self, values: Mapping[str, Iterable[object]], step: int | None = None, **kwargs: object
    ) -> None:
        """Log lists of images as ``swanlab.Image``.

        Args:
            values: name -> iterable of images (arrays, tensors or PIL images).
            step: the global step.
            **kwargs: passed to ``swanlab.Image``.
        """
        import swanlab

        self._tracker.log(
            {key: [swanlab.Image(image, **kwargs) for image in images] for key, images in values.items()},
            step=step,
        )

    @on_main_process
    def finish(self) -> None:
        """Finish the run."""
        if self._tracker is not None:
            import swanlab

            swanlab.finish()
