"""TensorBoard tracker: event files through ``torch.utils.tensorboard`` (or ``tensorboardX``)."""

from __future__ import annotations

import os
from collections.abc import Callable

from accelerando.backends.trackers.base import (
    GeneralTracker,
    flatten_config,
    missing_library_error,
    on_main_process,
    scalar_value,
)
from accelerando.logging import get_logger

__all__ = ["TensorBoardTracker"]

logger = get_logger(__name__)


def _summary_writer_class() -> Callable[..., object]:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        try:
            from tensorboardX import SummaryWriter
        except ImportError as exc:
            raise missing_library_error("tensorboard", "tensorboard") from exc
    return SummaryWriter


def _run_folder(logging_dir: str, run_name: str) -> str:
    """``<logging_dir>/<run_name>``, refused when the project name would leave ``logging_dir``.

    Raises:
        ValueError: If ``run_name`` is absolute or climbs above ``logging_dir`` with ``..``.
    """
    folder = os.path.join(logging_dir, run_name)
    root = os.path.normpath(os.path.abspath(logging_dir))
    inside = os.path.normpath(os.path.abspath(folder))
    if os.path.isabs(run_name) or os.path.commonpath([root, inside]) != root:
        raise ValueError(
            f"TensorBoard project name {run_name!r} would write outside logging_dir {logging_dir!r}; "
            "use a name inside it (no absolute path, no '..'), or change logging_dir."
        )
    return folder


class TensorBoardTracker(GeneralTracker):
    """Write scalars, text, hyperparameters and images to TensorBoard event files.

    Events go to ``<logging_dir>/<run_name>``.

    Args:
        run_name: the run's folder name inside ``logging_dir`` (the project name).
        logging_dir: the parent folder of the run.
        **kwargs: passed to ``SummaryWriter`` (``flush_secs``, ``max_queue``, ...).

    Raises:
        ValueError: ``logging_dir`` is missing, or ``run_name`` would put the run outside it (an
            absolute path, or ``..`` climbing above it).
    """

    name = "tensorboard"
    requires_logging_directory = True

    def __init__(
        self, run_name: str, logging_dir: str | os.PathLike[str] | None = None, **kwargs: object
    ) -> None:
        super().__init__()
        if logging_dir is None:
            raise ValueError(
                "TensorBoardTracker needs a logging directory: pass project_dir=... to Accelerator "
                "(or logging_dir=... when building the tracker)."
            )
        self.run_name = run_name
        self.logging_dir = _run_folder(os.fspath(logging_dir), run_name)
        self._kwargs = kwargs

    @on_main_process
    def start(self) -> None:
        """Open the ``SummaryWriter``."""
        self._tracker = _summary_writer_class()(self.logging_dir, **self._kwargs)
        logger.debug("Initialized TensorBoard project %s logging to %s", self.run_name, self.logging_dir)

    @on_main_process
    def store_init_configuration(self, values: dict[str, object]) -> None:
        """Store the configuration as TensorBoard hparams and as ``hparams.yml`` in the run folder.

        Args:
            values: the configuration (nested dicts are flattened to ``a/b`` keys).
        """
        import yaml

        flat = {k: (str(v) if v is None else v) for k, v in flatten_config(values).items()}
        writer = self._tracker
        try:
            from torch.utils.tensorboard.summary import hparams
        except ImportError:
            from tensorboardX.summary import hparams
        # Written into this run's own file, unlike SummaryWriter.add_hparams which opens a sub-run.
        for summary in hparams(flat, {}):
            writer._get_file_writer().add_summary(summary)
        os.makedirs(self.logging_dir, exist_ok=True)
        with open(os.path.join(self.logging_dir, "hparams.yml"), "w", encoding="utf-8") as handle:
            yaml.safe_dump(flat, handle)
        writer.flush()

    @on_main_process
    def log(self, values: dict[str, object], step: int | None = None, **kwargs: object) -> None:
        """Log numbers as scalars, strings as text and dicts of numbers as grouped scalars.

        Args:
            values: name -> number, str or dict of numbers.
            step: the global step.
            **kwargs: passed to ``add_scalar`` / ``add_text`` / ``add_scalars``.
        """
        writer = self._tracker
        for key, raw in values.items():
            value = scalar_value(raw)
            if isinstance(value, (int, float)):
                writer.add_scalar(key, value, global_step=step, **kwargs)
            elif isinstance(value, str):
                writer.add_text(key, value, global_step=step, **kwargs)
            elif isinstance(value, dict):
                numbers = {k: scalar_value(v) for k, v in value.items()}
                writer.add_scalars(key, numbers, global_step=step, **kwargs)
            else:
                logger.warning_once(
                    f"TensorBoardTracker: skipped {key!r}, a {type(raw).__name__} is not loggable."
                )
        writer.flush()

    @on_main_process
    def log_images(self, values: dict[str, object], step: int | None = None, **kwargs: object) -> None:
        """Log batches of images (``N x C x H x W`` by default; pass ``dataformats`` to change).

        Args:
            values: name -> image batch (tensor or numpy array).
            step: the global step.
            **kwargs: passed to ``add_images``.
        """
        for key, images in values.items():
            self._tracker.add_images(key, images, global_step=step, **kwargs)
        self._tracker.flush()

    @on_main_process
    def finish(self) -> None:
        """Flush and close the event file."""
        if self._tracker is not None:
            self._tracker.close()
