"""The tracker contract (:class:`GeneralTracker`) and helpers shared by every backend.

Life cycle, driven by :class:`accelerando.tracking.TrackingManager` (the Accelerator delegates to it):

1. ``__init__(run_name, ...)`` runs on every process; it only stores arguments and never touches
   the backend library, so building a tracker is cheap and safe on every rank.
2. ``start()`` creates the native run. It runs on the main process only, unless the class sets
   ``main_process_only = False``.
3. ``store_init_configuration(values)`` once, ``log(values, step)`` many times, ``finish()`` once.
   These are wrapped with :func:`on_main_process`, so calling them on another process is a no-op.

A backend library is imported inside ``start()`` (or the method that needs it), never at import time.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

from accelerando.logging import _process_view

__all__ = [
    "CHECKPOINT_SIZE_KEY",
    "GeneralTracker",
    "LibraryRunTracker",
    "flatten_config",
    "missing_library_error",
    "on_main_process",
    "sanitize_config",
    "scalar_value",
]

F = TypeVar("F", bound=Callable[..., object])

#: The metric ``log_checkpoint`` writes: in accelerando's own namespace, so no key of the script's is touched.
CHECKPOINT_SIZE_KEY = "accelerando/checkpoint_size_bytes"


def on_main_process(function: F) -> F:
    """Decorate a tracker method so that it runs on the main process only.

    The method still runs on every process when the tracker's ``main_process_only`` is ``False``.
    On other processes the call returns ``None`` without doing anything.

    Args:
        function: a method of a :class:`GeneralTracker` subclass.

    Returns:
        The wrapped method.
    """

    @functools.wraps(function)
    def wrapper(self: GeneralTracker, *args: object, **kwargs: object) -> object:
        if getattr(self, "main_process_only", True) and _process_view().rank != 0:
            return None
        return function(self, *args, **kwargs)

    return wrapper  # type: ignore[return-value]


class GeneralTracker:
    """Base class of every experiment tracker (built in or user-written).

    Subclasses set three class attributes and implement ``store_init_configuration`` and ``log``
    (``start``, ``finish``, ``log_images``, ``log_table`` are optional):

    - ``name`` (str): the key used in ``log_with``, ``init_kwargs`` and ``get_tracker``.
    - ``requires_logging_directory`` (bool): the Accelerator passes its ``logging_dir`` as the second
      positional argument when ``True``.
    - ``main_process_only`` (bool, default ``True``): run on rank 0 only.

    A user tracker written for the reference (setting ``self.run_name`` and calling its library in
    ``__init__``) works unchanged: ``start`` defaults to a no-op.

    Args:
        _blank: build a do-nothing placeholder (used for processes that hold no run); skips the
            attribute checks.

    Raises:
        NotImplementedError: a subclass misses ``name`` or ``requires_logging_directory``.
    """

    # Declared, not set: a subclass must define them (checked in __init__ with hasattr).
    name: str
    requires_logging_directory: bool
    main_process_only: bool = True
    # The backend library's own run / writer object; the libraries are untyped or optional.
    _tracker: Any = None

    def __init__(self, _blank: bool = False) -> None:
        self._started = False
        if _blank:
            return
        missing = [attr for attr in ("name", "requires_logging_directory") if not hasattr(self, attr)]
        if missing:
            raise NotImplementedError(
                f"{type(self).__name__} must define the class attribute(s) {', '.join(missing)} "
                "to be used as a tracker (see GeneralTracker's docstring)."
            )

    def start(self) -> None:
        """Create the native run (main process only unless ``main_process_only`` is False)."""

    def store_init_configuration(self, values: dict[str, object]) -> None:
        """Store the experiment's hyperparameters once.

        Args:
            values: the configuration; values a backend cannot store are converted by the backend
                (see :func:`sanitize_config`).
        """

    def log(self, values: dict[str, object], step: int | None = None, **kwargs: object) -> None:
        """Log a dictionary of values (scalars, strings, ...) at ``step``.

        Args:
            values: name -> value.
            step: the global step to attach the values to.
            **kwargs: backend-specific options (passed from ``log_kwargs[name]``).
        """

    def log_checkpoint(self, step: int | None, path: str, size_bytes: int) -> None:
        """Record that a checkpoint was committed (only with the ``log_checkpoint_metrics`` setting).

        Called by the checkpoint code on the main process. The default logs
        :data:`CHECKPOINT_SIZE_KEY` as a metric at ``step``, the script's own step; backends whose
        history is one row per step (W&B, DVCLive) add it to the current row instead, and backends
        with a richer notion (tags, artifacts) add that.

        Args:
            step: the script's step (the one its last ``log`` call gave; None when that call gave none,
                so that the tracker's own counter places it, as it placed the script's values).
            path: where the checkpoint was written.
            size_bytes: its total size on disk.
        """
        self.log({CHECKPOINT_SIZE_KEY: int(size_bytes)}, step=step)

    def finish(self) -> None:
        """Flush and close the native run."""

    @property
    def tracker(self) -> Any:
        """The backend's native object (writer, run, ...); ``None`` before ``start`` or off rank 0."""
        return getattr(self, "_tracker", None)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={getattr(self, 'name', None)!r})"


class LibraryRunTracker(GeneralTracker):
    """A tracker whose library starts a run with ``<module>.<init_function>(<project_keyword>=run_name, **kwargs)``.

    Subclasses set ``name``, ``module_name`` (and ``pip_package`` when it differs) and, if needed,
    ``init_function`` / ``project_keyword`` (None: the run name is not passed); they implement
    ``store_init_configuration``, ``log`` and ``finish`` against ``self._tracker``. A key of the init
    kwargs equal to ``project_keyword`` overrides the run name.

    Args:
        run_name: the project (or run) name given to ``init_trackers``.
        **kwargs: passed to the library's init function.
    """

    requires_logging_directory = False
    module_name: str = ""
    pip_package: str | None = None
    init_function = "init"
    project_keyword: str | None = "project"

    def __init__(self, run_name: str, **kwargs: object) -> None:
        super().__init__()
        self.run_name = run_name
        self._kwargs = kwargs

    def library(self) -> ModuleType:
        """Import the backend library.

        Raises:
            ImportError: it is not installed (the message names the pip package).
        """
        import importlib

        try:
            return importlib.import_module(self.module_name)
        except ImportError as exc:
            raise missing_library_error(self.name, self.pip_package or self.module_name) from exc

    @on_main_process
    def start(self) -> None:
        """Create the run with the library's init function."""
        init = getattr(self.library(), self.init_function)
        named = {self.project_keyword: self.run_name} if self.project_keyword else {}
        self._tracker = init(**{**named, **self._kwargs})  # an explicit init kwarg wins


def missing_library_error(tracker_name: str, pip_package: str) -> ImportError:
    """Build the error raised when a requested tracker's library is not installed.

    Args:
        tracker_name: the tracker's ``name``.
        pip_package: the package to install.

    Returns:
        An :class:`ImportError` whose message names the package to install.
    """
    return ImportError(
        f"The {tracker_name!r} tracker was requested but its library is not installed. "
        f"Install it with `pip install {pip_package}`, or remove {tracker_name!r} from log_with."
    )


def scalar_value(value: object) -> object:
    """Turn one-element tensors and numpy scalars into Python numbers; leave other values alone.

    Args:
        value: anything.

    Returns:
        A Python ``int``/``float``/``bool`` for scalar-like inputs, else ``value`` unchanged.
    """
    numel, item = getattr(value, "numel", None), getattr(value, "item", None)
    if callable(numel) and item is not None:
        return item() if numel() == 1 else value
    if type(value).__module__ == "numpy" and item is not None and getattr(value, "size", 2) == 1:
        return item()
    return value


def _sanitize_value(value: object) -> object:
    value = scalar_value(value)
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, enum.Enum):
        return _sanitize_value(value.value)
    if isinstance(value, Path):
        return str(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return sanitize_config(dataclasses.asdict(value))
    if isinstance(value, Mapping):
        return sanitize_config(value)
    if isinstance(value, (list, tuple)):
        return [_sanitize_value(v) for v in value]
    tolist = getattr(value, "tolist", None)
    if tolist is not None:
        return tolist()
    return str(value)


def sanitize_config(values: Mapping[str, object]) -> dict[str, object]:
    """Convert a configuration into plain JSON-like values every backend can store.

    Tensors and numpy scalars become numbers (or lists), enums their value, paths strings,
    dataclasses dicts, non-finite floats strings, and unknown objects their ``str``. Nesting is kept.

    Args:
        values: the configuration.

    Returns:
        A new dict with string keys.

    Raises:
        TypeError: ``values`` is not a mapping.
    """
    if not isinstance(values, Mapping):
        raise TypeError(
            f"config must be a dict of name -> value, got {type(values).__name__}; wrap it in a dict."
        )
    return {str(key): _sanitize_value(value) for key, value in values.items()}


def flatten_config(values: Mapping[str, object], sep: str = "/") -> dict[str, object]:
    """Sanitize and flatten nested dicts into ``parent/child`` keys, for backends with flat params.

    Lists are stored as their string form.

    Args:
        values: the configuration.
        sep: separator placed between nested keys.

    Returns:
        A flat dict of str -> bool/int/float/str/None.
    """
    flat: dict[str, object] = {}

    def visit(prefix: str, node: object) -> None:
        if isinstance(node, Mapping):
            for key, child in node.items():
                visit(f"{prefix}{sep}{key}" if prefix else str(key), child)
        elif isinstance(node, list):
            flat[prefix] = str(node)
        else:
            flat[prefix] = node

    visit("", sanitize_config(values))
    return flat
