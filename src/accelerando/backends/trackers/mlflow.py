"""MLflow tracker: a run in a local file/sqlite store or a tracking server."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from accelerando.backends.trackers.base import (
    CHECKPOINT_SIZE_KEY,
    GeneralTracker,
    flatten_config,
    missing_library_error,
    on_main_process,
    scalar_value,
)
from accelerando.common.imports import is_package_available
from accelerando.core.settings import environment_text
from accelerando.logging import get_logger

if TYPE_CHECKING:
    from mlflow import ActiveRun

__all__ = ["MLflowTracker"]

logger = get_logger(__name__)

# MLflow accepts at most 100 params per batch call and bounds the length of each value
# (mlflow.utils.validation.MAX_PARAM_VAL_LENGTH; this is its value where the import fails).
_PARAMS_PER_BATCH = 100
_MAX_PARAM_VALUE_LENGTH = 6000
_TRUE = frozenset({"1", "true", "yes", "y", "on", "t"})
_FALSE = frozenset({"0", "false", "no", "n", "off", "f"})


def _env_flag(name: str, default: bool) -> bool:
    """A yes/no environment variable (``MLFLOW_NESTED_RUN``), else ``default``.

    Raises:
        ValueError: the variable is neither a true nor a false spelling.
    """
    text = environment_text(name)
    if text is None:
        return bool(default)
    low = text.strip().lower()
    if low in _TRUE or low in _FALSE:
        return low in _TRUE
    raise ValueError(f"invalid truth value {text!r} for {name}: use true/false, yes/no, on/off or 1/0.")


def _max_param_length(mlflow: ModuleType) -> int:
    try:
        return int(mlflow.utils.validation.MAX_PARAM_VAL_LENGTH)
    except (AttributeError, TypeError, ValueError):
        return _MAX_PARAM_VALUE_LENGTH


def _is_uri(text: str) -> bool:
    return "://" in text or text.startswith(("sqlite:", "file:", "databricks"))


def _tracking_uri(logging_dir: str | os.PathLike[str]) -> str:
    """Map a folder to a store URI; URIs pass through.

    Recent MLflow refuses new plain-folder (file) stores, so a folder becomes an sqlite database
    inside it when SQLAlchemy is installed (``mlflow`` proper depends on it; ``mlflow-skinny`` not).
    """
    text = os.fspath(logging_dir)
    if _is_uri(text):
        return text
    folder = os.path.abspath(text)
    if is_package_available("sqlalchemy"):
        os.makedirs(folder, exist_ok=True)
        return "sqlite:///" + os.path.join(folder, "mlflow.db")
    return folder


# The tracking URIs this module set; any other set URI is the user's choice.
_URIS_SET_HERE: set[str] = set()


def _use_store(mlflow: ModuleType, logging_dir: str) -> None:
    """Make ``logging_dir`` MLflow's store: always for a URI, for a folder unless the user chose one.

    A tracking URI the user set (``mlflow.set_tracking_uri`` or ``MLFLOW_TRACKING_URI``) is kept when
    ``logging_dir`` is a plain folder (the Accelerator may pass its project folder on its own).
    """
    users_choice = mlflow.is_tracking_uri_set() and mlflow.get_tracking_uri() not in _URIS_SET_HERE
    if users_choice and not _is_uri(logging_dir):
        logger.debug(f"MLflowTracker: keeping the tracking URI {mlflow.get_tracking_uri()!r}.")
        return
    mlflow.set_tracking_uri(_tracking_uri(logging_dir))
    _URIS_SET_HERE.add(mlflow.get_tracking_uri())


def _parse_tags(tags: dict[str, object] | str | None) -> dict[str, object] | None:
    """Tags as a dict; text is read as a JSON object.

    Raises:
        ValueError: text that is not a JSON object.
    """
    if not isinstance(tags, str):
        return tags
    try:
        parsed = json.loads(tags)
    except json.JSONDecodeError as exc:
        raise ValueError(f"MLflowTracker tags={tags!r} is not JSON; pass a dict or a JSON object") from exc
    if not isinstance(parsed, dict):
        raise ValueError(f"MLflowTracker tags={tags!r} must be a JSON object (name -> value)")
    return parsed


class MLflowTracker(GeneralTracker):
    """Log to an MLflow run.

    The variables ``MLFLOW_EXPERIMENT_NAME``, ``MLFLOW_RUN_ID``, ``MLFLOW_TAGS`` (a JSON object) and
    ``MLFLOW_NESTED_RUN`` (true/false) take priority over the matching arguments, as in the reference.

    Args:
        experiment_name: the experiment (the Accelerator passes the project name).
        logging_dir: tracking URI or folder (``sqlite:///runs.db``, ``./mlruns``, ``http://...``). A
            folder becomes the store unless a tracking URI is already set (``mlflow.set_tracking_uri``
            or ``MLFLOW_TRACKING_URI``), which is then kept; ``None`` keeps MLflow's own default.
        run_id: resume this run instead of creating one.
        tags: tags set on the run (a dict, or a JSON object as text).
        nested_run: start the run nested in the active one.
        run_name: a display name for the run.
        description: a description shown in the UI.

    Attributes:
        active_run: the ``mlflow.ActiveRun`` once started (``None`` before, and off the main process).

    Raises:
        ValueError: ``MLFLOW_NESTED_RUN`` is not a yes/no value, or ``tags`` / ``MLFLOW_TAGS`` is not a
            JSON object.
    """

    name = "mlflow"
    requires_logging_directory = False

    def __init__(
        self,
        experiment_name: str | None = None,
        logging_dir: str | os.PathLike[str] | None = None,
        run_id: str | None = None,
        tags: dict[str, object] | str | None = None,
        nested_run: bool | None = False,
        run_name: str | None = None,
        description: str | None = None,
    ) -> None:
        super().__init__()
        self.experiment_name = environment_text("MLFLOW_EXPERIMENT_NAME") or experiment_name
        self.logging_dir = logging_dir
        self.run_id = environment_text("MLFLOW_RUN_ID") or run_id
        self.tags = _parse_tags(environment_text("MLFLOW_TAGS") or tags)
        self.nested_run = _env_flag("MLFLOW_NESTED_RUN", bool(nested_run))
        self.run_name = run_name
        self.description = description
        self.active_run: ActiveRun | None = None
        self._ended = False

    @property
    def tracker(self) -> ActiveRun | None:
        """The ``mlflow.ActiveRun`` (``None`` before ``start`` or off the main process)."""
        return self.active_run

    @on_main_process
    def start(self) -> None:
        """Point MLflow at ``logging_dir`` and start (or resume) the run."""
        try:
            import mlflow
        except ImportError as exc:
            raise missing_library_error(self.name, "mlflow") from exc
        if self.logging_dir is not None:
            _use_store(mlflow, os.fspath(self.logging_dir))
        experiment_id = None
        if self.experiment_name and self.run_id is None:
            experiment_id = self._experiment_id(mlflow)
        self._ended = False
        self.active_run = mlflow.start_run(
            run_id=self.run_id,
            experiment_id=experiment_id,
            run_name=self.run_name,
            nested=self.nested_run,
            tags=self.tags,
            description=self.description,
        )

    def _experiment_id(self, mlflow: ModuleType) -> str:
        experiment = mlflow.get_experiment_by_name(self.experiment_name)
        if experiment is not None:
            return experiment.experiment_id
        artifacts = None
        if self.logging_dir is not None and not _is_uri(os.fspath(self.logging_dir)):
            # Keep artifacts beside the store instead of in the current working directory.
            artifacts = Path(os.path.abspath(self.logging_dir), "artifacts").as_uri()
        return mlflow.create_experiment(self.experiment_name, artifact_location=artifacts)

    @on_main_process
    def store_init_configuration(self, values: dict[str, object]) -> None:
        """Log the configuration as run params (flattened to ``a/b`` keys); too long values are dropped.

        Args:
            values: the configuration.
        """
        import mlflow

        limit = _max_param_length(mlflow)
        params = {}
        for key, value in flatten_config(values).items():  # a new dict: the caller's stays as it is
            text = str(value)
            if len(text) > limit:
                logger.warning(
                    f"MLflowTracker: param {key!r} is {len(text)} characters long and MLflow accepts at "
                    f"most {limit}; it was not logged (log it as an artifact instead)."
                )
                continue
            params[key] = text
        items = list(params.items())
        for start in range(0, len(items), _PARAMS_PER_BATCH):
            mlflow.log_params(dict(items[start : start + _PARAMS_PER_BATCH]))

    @on_main_process
    def log(
        self,
        values: dict[str, object],
        step: int | None = None,
        **kwargs: Any,  # mlflow.log_metrics's own keyword parameters, each with its type
    ) -> None:
        """Log numeric values as metrics; other values are skipped with a warning (once per key).

        Args:
            values: name -> number.
            step: the global step.
            **kwargs: passed to ``mlflow.log_metrics``.
        """
        import mlflow

        metrics = {}
        for key, raw in values.items():
            value = scalar_value(raw)
            if isinstance(value, (int, float)):
                metrics[key] = float(value)
            else:
                logger.warning_once(f"MLflowTracker: skipped {key!r}; MLflow metrics must be numbers.")
        if metrics:
            mlflow.log_metrics(metrics, step=step, **kwargs)

    @on_main_process
    def log_checkpoint(self, step: int | None, path: str, size_bytes: int) -> None:
        """Log the checkpoint size as a metric and its path as the ``last_checkpoint`` tag (opt-in, see base)."""
        import mlflow

        mlflow.set_tag("last_checkpoint", str(path))
        self.log({CHECKPOINT_SIZE_KEY: int(size_bytes)}, step=step)

    @on_main_process
    def log_figure(
        self,
        figure: object,
        artifact_file: str,
        **kwargs: Any,  # mlflow.log_figure's own keyword parameters, each with its type
    ) -> None:
        """Save a matplotlib/plotly figure as a run artifact.

        Args:
            figure: the figure.
            artifact_file: path of the artifact inside the run (e.g. ``plots/loss.png``).
            **kwargs: passed to ``mlflow.log_figure``.
        """
        import mlflow

        mlflow.log_figure(figure=figure, artifact_file=artifact_file, **kwargs)

    @on_main_process
    def log_artifact(self, local_path: str, artifact_path: str | None = None) -> None:
        """Upload a local file as a run artifact.

        Args:
            local_path: the file to upload.
            artifact_path: folder inside the run's artifacts.
        """
        import mlflow

        mlflow.log_artifact(local_path=local_path, artifact_path=artifact_path)

    @on_main_process
    def log_artifacts(self, local_dir: str, artifact_path: str | None = None) -> None:
        """Upload every file under a local folder as run artifacts.

        Args:
            local_dir: the folder to upload.
            artifact_path: folder inside the run's artifacts.
        """
        import mlflow

        mlflow.log_artifacts(local_dir=local_dir, artifact_path=artifact_path)

    @on_main_process
    def finish(self) -> None:
        """End the run; a second call does nothing (it would end whatever run is active then)."""
        if self.active_run is not None and not self._ended:
            import mlflow

            mlflow.end_run()
            self._ended = True
