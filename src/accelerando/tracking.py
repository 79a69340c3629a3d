"""Experiment trackers: the public classes, the registry, and the manager the Accelerator delegates to.

``Accelerator(log_with=...)`` builds a :class:`TrackingManager` (held by its
``accelerando.facade.observing.Observability`` service); its methods back ``init_trackers``,
``log``, ``get_tracker``, ``end_training`` and ``trackers``::

    self.tracking = TrackingManager(log_with, logging_dir)          # in Observability
    init_trackers(name, config, init_kwargs) -> self.tracking.init(name, config, init_kwargs)
    log(values, step, log_kwargs)            -> self.tracking.log(values, step, log_kwargs)
    get_tracker(name, unwrap)                -> self.tracking.get(name, unwrap)
    end_training()                           -> self.tracking.finish()
    trackers                                 -> self.tracking.trackers

Importing this module imports no tracker library: each backend imports its own in ``start()``.
"""

from __future__ import annotations

import inspect
import os
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from accelerando.backends.trackers.aim import AimTracker
from accelerando.backends.trackers.base import (
    CHECKPOINT_SIZE_KEY,
    GeneralTracker,
    on_main_process,
    scalar_value,
)
from accelerando.backends.trackers.clearml import ClearMLTracker
from accelerando.backends.trackers.comet import CometMLTracker
from accelerando.backends.trackers.dvclive import DVCLiveTracker
from accelerando.backends.trackers.mlflow import MLflowTracker
from accelerando.backends.trackers.neptune import NeptuneTracker
from accelerando.backends.trackers.swanlab import SwanLabTracker
from accelerando.backends.trackers.tensorboard import TensorBoardTracker
from accelerando.backends.trackers.trackio import TrackioTracker
from accelerando.backends.trackers.wandb import WandBTracker
from accelerando.common import imports
from accelerando.core.enums_on_demand import LoggerType
from accelerando.logging import _process_view, get_logger

__all__ = [
    "LOGGER_TYPE_TO_CLASS",
    "AimTracker",
    "ClearMLTracker",
    "CometMLTracker",
    "DVCLiveTracker",
    "GeneralTracker",
    "MLflowTracker",
    "NeptuneTracker",
    "SwanLabTracker",
    "TensorBoardTracker",
    "TrackingManager",
    "TrackioTracker",
    "WandBTracker",
    "filter_trackers",
    "get_available_trackers",
    "on_main_process",
    "register_tracker_class",
]

logger = get_logger(__name__)

_REDUCE_OPS = ("mean", "sum", "max", "min")


@dataclass(frozen=True)
class _Library:
    """What a tracker needs installed: the pip package to suggest and how to tell it is there."""

    pip_package: str
    is_available: Callable[[], bool]


#: Tracker name -> class, for every registered backend (built in or added by ``register_tracker_class``).
#: The one table names resolve through: a class put here by hand is selectable too.
LOGGER_TYPE_TO_CLASS: dict[str, type[GeneralTracker]] = {
    "tensorboard": TensorBoardTracker,
    "wandb": WandBTracker,
    "comet_ml": CometMLTracker,
    "aim": AimTracker,
    "mlflow": MLflowTracker,
    "clearml": ClearMLTracker,
    "dvclive": DVCLiveTracker,
    "swanlab": SwanLabTracker,
    "trackio": TrackioTracker,
    "neptune": NeptuneTracker,
}


def _check(name: str) -> Callable[[], bool]:
    # The package checks are generated in accelerando.common.imports (invisible to static analysis).
    return getattr(imports, name)


# Tracker name -> its library; a name without an entry needs nothing (always available).
_LIBRARIES: dict[str, _Library] = {
    "tensorboard": _Library("tensorboard", _check("is_tensorboard_available")),
    "wandb": _Library("wandb", _check("is_wandb_available")),
    "comet_ml": _Library("comet_ml", _check("is_comet_ml_available")),
    "aim": _Library("aim", _check("is_aim_available")),
    "mlflow": _Library("mlflow", _check("is_mlflow_available")),
    "clearml": _Library("clearml", _check("is_clearml_available")),
    "dvclive": _Library("dvclive", _check("is_dvclive_available")),
    "swanlab": _Library("swanlab", _check("is_swanlab_available")),
    "trackio": _Library("trackio", _check("is_trackio_available")),
    "neptune": _Library("neptune", _check("is_neptune_available")),
}


def _library(name: str) -> _Library:
    return _LIBRARIES.get(name) or _Library(name, lambda: True)


def register_tracker_class(
    tracker_class: type[GeneralTracker],
    pip_package: str | None = None,
    is_available: Callable[[], bool] | None = None,
) -> type[GeneralTracker]:
    """Make a tracker class selectable by its ``name`` in ``log_with`` (and by ``"all"``).

    Register it before building the Accelerator that uses it. The Accelerator builds it with the
    project name as first positional argument, its logging directory as second when
    ``requires_logging_directory`` is True, and ``init_kwargs[name]`` as keyword arguments. Registering
    a name that is already taken (a built-in tracker included) replaces it, with a ``UserWarning``.
    Usable as a class decorator.

    Args:
        tracker_class: a :class:`GeneralTracker` subclass with a non-empty ``name`` and a
            ``requires_logging_directory`` class attribute.
        pip_package: the package to suggest when its library is missing.
        is_available: tells whether its library is installed (default: always).

    Returns:
        ``tracker_class`` unchanged.

    Raises:
        ValueError: ``tracker_class`` is not a GeneralTracker subclass, has no non-empty ``name`` or no
            ``requires_logging_directory``.
    """
    cls = tracker_class
    if not (isinstance(cls, type) and issubclass(cls, GeneralTracker)):
        raise ValueError(f"`tracker_class` must be a subclass of `GeneralTracker`, but got {cls!r}.")
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name:
        raise ValueError(
            f"The tracker class to register must define a non-empty `name` attribute ({cls.__name__} has "
            f"{name!r}): add e.g. `name = {cls.__name__.lower()!r}` to the class."
        )
    if not isinstance(getattr(cls, "requires_logging_directory", None), bool):
        raise ValueError(
            "The tracker class to register must define a `requires_logging_directory` class attribute. Set "
            "it to `True` if the tracker needs a logging directory, or `False` otherwise."
        )
    if name in LOGGER_TYPE_TO_CLASS:
        warnings.warn(
            f"A tracker with the name {name!r} is already registered and will be overwritten by {cls!r}. "
            "This is especially significant when shadowing a built-in tracker.",
            UserWarning,
            stacklevel=2,
        )
    _LIBRARIES[name] = _Library(pip_package or name, is_available or (lambda: True))
    LOGGER_TYPE_TO_CLASS[name] = cls
    return cls


def get_available_trackers() -> list[str]:
    """Return the names of registered trackers whose library is installed."""
    return [name for name in LOGGER_TYPE_TO_CLASS if _library(name).is_available()]


def _as_list(log_with: object) -> list[object]:
    if log_with is None:
        return []
    if isinstance(log_with, (str, LoggerType, GeneralTracker, type)):
        return [log_with]
    if isinstance(log_with, Iterable):
        return list(log_with)
    raise TypeError(
        f"log_with must be a tracker name, LoggerType, GeneralTracker (class or instance) or a list of them; "
        f"got {type(log_with).__name__}."
    )


def _resolve_name(
    name: str, logging_dir: str | os.PathLike[str] | None, explicit: bool
) -> type[GeneralTracker] | None:
    cls = LOGGER_TYPE_TO_CLASS.get(name)
    if cls is None:
        raise ValueError(f"Unknown tracker {name!r}; choose from {sorted(LOGGER_TYPE_TO_CLASS)} or 'all'.")
    library = _library(name)
    if not library.is_available():
        if not explicit:
            return None
        raise ImportError(
            f"The {name!r} tracker was requested but its library is not installed. "
            f"Install it with `pip install {library.pip_package}`, or remove {name!r} from log_with."
        )
    if cls.requires_logging_directory and logging_dir is None:
        if not explicit:
            logger.warning(
                f"log_with='all': skipping {name!r}, which needs a logging directory (set project_dir)."
            )
            return None
        raise ValueError(
            f"Logging with `{name}` requires a `logging_dir` to be passed in: pass "
            "Accelerator(project_dir=...) or ProjectConfiguration(logging_dir=...)."
        )
    return cls


def filter_trackers(
    log_with: object, logging_dir: str | os.PathLike[str] | None = None
) -> list[type[GeneralTracker] | GeneralTracker]:
    """Turn a ``log_with`` specification into tracker classes and instances.

    Args:
        log_with: a name, :class:`~accelerando.utils.LoggerType`, GeneralTracker class or instance,
            ``"all"`` (every installed backend), or a list mixing them. ``None`` means no tracker.
        logging_dir: the Accelerator's logging directory (required by file-based trackers).

    Returns:
        Tracker classes (to build in ``init``) and instances (used as given), without duplicates.

    Raises:
        ValueError: an unknown name, or a file-based tracker without ``logging_dir``.
        ImportError: an explicitly named tracker whose library is missing (names the pip package).
        TypeError: an entry of an unsupported type.
    """
    entries = _as_list(log_with)
    wants_all = any(str(e) == "all" for e in entries if isinstance(e, (str, LoggerType)))
    chosen: list[type[GeneralTracker] | GeneralTracker] = []
    for entry in entries:
        if isinstance(entry, (str, LoggerType)):
            name = entry.value if isinstance(entry, LoggerType) else entry.lower()
            if name == "all":
                continue
            cls = _resolve_name(name, logging_dir, explicit=True)
            if cls is not None:  # always: an explicit name resolves or raises
                chosen.append(cls)
        elif isinstance(entry, GeneralTracker) or (
            isinstance(entry, type) and issubclass(entry, GeneralTracker)
        ):
            chosen.append(entry)
        else:
            raise TypeError(
                f"log_with entry {entry!r} is not a tracker name, LoggerType or GeneralTracker; "
                f"use one of {sorted(LOGGER_TYPE_TO_CLASS)} or a GeneralTracker subclass/instance."
            )
    if wants_all:
        for name in list(LOGGER_TYPE_TO_CLASS):
            cls = _resolve_name(name, logging_dir, explicit=False)
            if cls is not None:
                chosen.append(cls)
    unique: list[type[GeneralTracker] | GeneralTracker] = []
    seen: set[str] = set()
    for entry in chosen:
        key = getattr(entry, "name", None) or repr(entry)
        if key not in seen:
            seen.add(key)
            unique.append(entry)
    return unique


def _runs_here(tracker: GeneralTracker | type[GeneralTracker]) -> bool:
    return not getattr(tracker, "main_process_only", True) or _process_view().rank == 0


def _accepts_logging_dir(cls: type) -> bool:
    try:
        return "logging_dir" in inspect.signature(cls).parameters
    except (TypeError, ValueError):
        return False


def _construct(
    tracker_class: Callable[..., GeneralTracker], *args: object, **kwargs: object
) -> GeneralTracker:
    # Each backend has its own constructor; register_tracker_class documents the calling convention.
    return tracker_class(*args, **kwargs)


def _reduce_values(values: dict[str, object], op: str) -> dict[str, object]:
    """Reduce the numeric entries of ``values`` across processes; other entries are kept as is."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return values
    numbers = {k: v for k, v in values.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    keys = sorted(numbers)
    every_keys: list[object] = [None] * dist.get_world_size()
    dist.all_gather_object(every_keys, keys)
    if any(other != keys for other in every_keys):
        raise ValueError(
            f"log(..., reduce={op!r}) needs the same numeric keys on every process; got {every_keys}. "
            "Log the same metric names on all processes, or drop reduce=."
        )
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
    tensor = torch.tensor([float(numbers[k]) for k in keys], dtype=torch.float64, device=device)
    dist_op = {"mean": dist.ReduceOp.SUM, "sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}.get(
        op, dist.ReduceOp.MIN
    )
    dist.all_reduce(tensor, op=dist_op)
    if op == "mean":
        tensor /= dist.get_world_size()
    reduced = dict(values)
    for key, number in zip(keys, tensor.tolist(), strict=True):
        keep_int = op != "mean" and isinstance(numbers[key], int)
        reduced[key] = int(number) if keep_int else number
    return reduced


class TrackingManager:
    """Owns the trackers of one Accelerator and fans calls out to them.

    Contract: build it on every process (cheap: no library is imported). Call :meth:`init` once on
    every process; only the processes a tracker runs on (rank 0 unless ``main_process_only=False``)
    create runs and write. :meth:`log` with ``reduce=`` must be called by every process.

    Args:
        log_with: see :func:`filter_trackers`.
        logging_dir: the Accelerator's logging directory.

    Attributes:
        last_step: the ``step`` of the script's last :meth:`log` call (None before the first one, or
            when that call gave none): checkpoint metrics are logged at it, so that they follow the
            script's own step axis and never move it.

    Raises:
        ValueError, ImportError, TypeError: as :func:`filter_trackers`.
    """

    def __init__(self, log_with: object = None, logging_dir: str | os.PathLike[str] | None = None) -> None:
        self.logging_dir = logging_dir
        self._requested = filter_trackers(log_with, logging_dir)
        self._trackers: list[GeneralTracker] = []
        self.last_step: int | None = None

    @property
    def trackers(self) -> list[GeneralTracker]:
        """The trackers built by :meth:`init` (empty before)."""
        return list(self._trackers)

    def _build(
        self, cls: type[GeneralTracker], project_name: str, kwargs: dict[str, object]
    ) -> GeneralTracker:
        if cls.requires_logging_directory:
            return _construct(cls, project_name, self.logging_dir, **kwargs)
        if self.logging_dir is not None and "logging_dir" not in kwargs and _accepts_logging_dir(cls):
            kwargs = {**kwargs, "logging_dir": self.logging_dir}
        return _construct(cls, project_name, **kwargs)

    def init(
        self,
        project_name: str,
        config: dict[str, object] | None = None,
        init_kwargs: Mapping[str, Mapping[str, object]] | None = None,
    ) -> None:
        """Build and start every requested tracker and store ``config`` in each.

        Args:
            project_name: the project / run name handed to every tracker.
            config: hyperparameters stored once (values a backend cannot store are converted).
            init_kwargs: tracker name -> keyword arguments for that tracker's constructor, e.g.
                ``{"wandb": {"mode": "offline"}}``.

        Raises:
            TypeError: ``init_kwargs`` is not a dict of dicts.
        """
        init_kwargs = dict(init_kwargs or {})
        if not all(isinstance(v, Mapping) for v in init_kwargs.values()):
            raise TypeError(
                'init_kwargs maps tracker names to dicts of options, e.g. {"wandb": {"mode": "offline"}}.'
            )
        known = {getattr(e, "name", None) for e in self._requested}
        for name in set(init_kwargs) - known:
            logger.warning(
                f"init_kwargs[{name!r}] is ignored: no such tracker in log_with ({sorted(map(str, known))})."
            )
        self._trackers = []
        for entry in self._requested:
            if isinstance(entry, type):
                tracker = self._build(entry, project_name, dict(init_kwargs.get(entry.name, {})))
            else:
                tracker = entry
            if _runs_here(tracker) and not getattr(tracker, "_started", False):
                tracker.start()
                tracker._started = True
            if config is not None and _runs_here(tracker):
                tracker.store_init_configuration(config)
            self._trackers.append(tracker)

    def log(
        self,
        values: Mapping[str, object],
        step: int | None = None,
        log_kwargs: Mapping[str, Mapping[str, object]] | None = None,
        reduce: str | None = None,
    ) -> None:
        """Log ``values`` at ``step`` to every tracker that runs on this process.

        Args:
            values: name -> value; one-element tensors become numbers.
            step: the global step.
            log_kwargs: tracker name -> extra keyword arguments for that tracker's ``log``.
            reduce: ``"mean"``, ``"sum"``, ``"max"`` or ``"min"`` to combine each numeric value across
                processes before the main process writes it (every process must call ``log`` then).

        Raises:
            TypeError: ``values`` is not a dict.
            ValueError: an unknown ``reduce`` op, or processes logging different numeric keys.
        """
        if not isinstance(values, Mapping):
            raise TypeError(f"log() takes a dict of name -> value, got {type(values).__name__}.")
        if reduce is not None and reduce not in _REDUCE_OPS:
            raise ValueError(f"reduce must be one of {_REDUCE_OPS} or None, got {reduce!r}.")
        values = {key: scalar_value(value) for key, value in values.items()}
        if reduce is not None:
            values = _reduce_values(values, reduce)
        log_kwargs = log_kwargs or {}
        self.last_step = step
        for tracker in self._trackers:
            if _runs_here(tracker):
                tracker.log(values, step=step, **log_kwargs.get(tracker.name, {}))

    def log_images(self, values: dict[str, object], step: int | None = None, **kwargs: object) -> None:
        """Log images to every running tracker that implements ``log_images``."""
        for tracker in self._trackers:
            log_images = getattr(tracker, "log_images", None)
            if _runs_here(tracker) and log_images is not None:
                log_images(values, step=step, **kwargs)

    def log_checkpoint(self, step: int | None, path: str | os.PathLike[str], size_bytes: int) -> None:
        """Record a committed checkpoint in every tracker (called by the checkpoint code, main process).

        Only with the ``log_checkpoint_metrics`` setting: by default ``save_state`` logs nothing to the
        trackers. The metric is :data:`~accelerando.backends.trackers.base.CHECKPOINT_SIZE_KEY`, in
        accelerando's own namespace.

        Args:
            step: the script's step (:attr:`last_step`), never
                ``accelerator.step`` (micro-batches, restarting each epoch: a tracker keeping one row
                per step would drop the script's rows logged after a lower step).
            path: the checkpoint folder.
            size_bytes: its size on disk.
        """
        for tracker in self._trackers:
            if not _runs_here(tracker):
                continue
            if hasattr(tracker, "log_checkpoint"):
                tracker.log_checkpoint(step, os.fspath(path), int(size_bytes))
            else:
                tracker.log({CHECKPOINT_SIZE_KEY: int(size_bytes)}, step=step)

    def get_tracker(self, name: str, unwrap: bool = False) -> object:
        """Return the tracker called ``name``, or its native object with ``unwrap=True``.

        On a process where the tracker does not run, the native object is ``None``.

        Args:
            name: the tracker's ``name`` (e.g. ``"wandb"``).
            unwrap: return the backend's own object (run, writer, ...) instead of the wrapper.

        Returns:
            The tracker, its native object, or a blank :class:`GeneralTracker` when no trackers exist
            (so calls on it do nothing).

        Raises:
            ValueError: trackers exist but none is called ``name``.
        """
        for tracker in self._trackers:
            if tracker.name == name:
                return tracker.tracker if unwrap else tracker
        if not self._trackers:
            return GeneralTracker(_blank=True)
        raise ValueError(
            f"No tracker named {name!r}; the active trackers are {[t.name for t in self._trackers]}."
        )

    def get(self, name: str, unwrap: bool = False) -> object:
        """Alias of :meth:`get_tracker`."""
        return self.get_tracker(name, unwrap=unwrap)

    def finish(self) -> None:
        """Call ``finish`` on every running tracker (``end_training``)."""
        for tracker in self._trackers:
            if _runs_here(tracker):
                tracker.finish()
