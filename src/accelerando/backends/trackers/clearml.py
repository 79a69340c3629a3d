"""ClearML tracker; call ``clearml.Task.set_offline(True)`` (or set ``CLEARML_OFFLINE_MODE=1``) to run offline."""

from __future__ import annotations

from accelerando.backends.trackers.base import (
    GeneralTracker,
    missing_library_error,
    on_main_process,
    sanitize_config,
    scalar_value,
)
from accelerando.logging import get_logger

__all__ = ["ClearMLTracker"]

logger = get_logger(__name__)


def _title_series(key: str) -> tuple[str, str]:
    # ClearML plots group series under a title: "train/loss" -> plot "train", series "loss".
    title, sep, series = key.partition("/")
    return (title, series) if sep else (key, key)


def _as_image(image: object) -> object:
    """A numpy array or PIL image ClearML can report (tensors are moved to the CPU as arrays)."""
    detach = getattr(image, "detach", None)
    if detach is not None:  # a torch tensor: CHW -> HWC when it looks channel-first
        array = detach().cpu().numpy()
        if array.ndim == 3 and array.shape[0] in (1, 3, 4) and array.shape[-1] not in (1, 3, 4):
            array = array.transpose(1, 2, 0)
        return array
    return image


class ClearMLTracker(GeneralTracker):
    """Log to a ClearML task (the current one if a task is already running).

    Args:
        run_name: the project name (``project_name``) and default task name.
        **kwargs: passed to ``clearml.Task.init``.
    """

    name = "clearml"
    requires_logging_directory = False

    def __init__(self, run_name: str | None = None, **kwargs: object) -> None:
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
    def store_init_configuration(self, values: dict[str, object]) -> None:
        """Connect the configuration to the task.

        Args:
            values: the configuration.
        """
        self._tracker.connect_configuration(sanitize_config(values))

    @on_main_process
    def log(self, values: dict[str, object], step: int | None = None, **kwargs: object) -> None:
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
    def log_images(self, values: dict[str, object], step: int | None = None, **kwargs: object) -> None:
        """Report images (numpy arrays or PIL images; a list reports each one) as debug samples.

        Args:
            values: name -> image or list of images; ``title/series`` keys as in :meth:`log`.
            step: the iteration (0 when None).
            **kwargs: passed to ``report_image``.
        """
        clearml_logger = self._tracker.get_logger()
        for key, images in values.items():
            title, series = _title_series(key)
            many = isinstance(images, (list, tuple))
            for index, image in enumerate(images if many else [images]):
                clearml_logger.report_image(
                    title=title,
                    series=f"{series}_{index}" if many else series,
                    iteration=0 if step is None else step,
                    image=_as_image(image),
                    **kwargs,
                )

    @on_main_process
    def log_table(
        self,
        table_name: str,
        columns: list[str] | None = None,
        data: list[list[object]] | None = None,
        dataframe: object = None,
        step: int | None = None,
        **kwargs: object,
    ) -> None:
        """Report a table, from a pandas ``dataframe`` or from ``data`` rows (``columns`` as header).

        Args:
            table_name: the table's title (and series).
            columns: header row used with ``data``.
            data: rows, used when ``dataframe`` is None.
            dataframe: a pandas DataFrame.
            step: the iteration (0 when None).
            **kwargs: passed to ``report_table``.

        Raises:
            ValueError: neither ``dataframe`` nor ``data`` was given.
        """
        if dataframe is None:
            if data is None:
                raise ValueError("ClearMLTracker.log_table needs dataframe=... or data=[[...], ...] rows")
            dataframe = [list(columns), *data] if columns else data
        self._tracker.get_logger().report_table(
            title=table_name,
            series=table_name,
            iteration=0 if step is None else step,
            table_plot=dataframe,
            **kwargs,
        )

    @on_main_process
    def finish(self) -> None:
        """Close the task if this tracker created it."""
        if self._tracker is not None and self._owns_task:
            self._tracker.close()
