"""Let code written for Hugging Face Accelerate import accelerando under the name ``accelerate``.

``install_as_accelerate()`` puts a finder first on ``sys.meta_path``. From then on:

* ``import accelerate`` gives a thin view of the :mod:`accelerando` package: every attribute read,
  write and delete goes to :mod:`accelerando` itself (so ``mock.patch("accelerate.Accelerator")``
  patches what ``from accelerando import Accelerator`` sees), except ``__version__``, which reports
  :data:`ACCELERATE_COMPAT_VERSION` (libraries such as peft and trl compare ``accelerate.__version__``
  to pick code paths; accelerando's own ``__version__`` stays its own).
* ``import accelerate.X.Y`` gives the very module object ``accelerando.X.Y``
  (``sys.modules["accelerate.utils"] is sys.modules["accelerando.utils"]``), so patching a name in
  one is patching it in the other.
* ``importlib.util.find_spec("accelerate")`` finds it and ``importlib.metadata.version("accelerate")``
  / ``distribution("accelerate")`` answer :data:`ACCELERATE_COMPAT_VERSION`, even when the real
  ``accelerate`` distribution is installed too.

The real ``accelerate`` package may stay installed; the stand-in wins once installed. Installing it
after the real package was imported in the same process is refused: two different ``Accelerator``
classes in one process would break ``isinstance`` checks and shared state in ways hard to trace.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import importlib.util
import logging
import os
import sys
import threading
import types
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pathlib

__all__ = [
    "ACCELERATE_COMPAT_VERSION",
    "STAND_IN_NAME",
    "AccelerateAlreadyImportedError",
    "install_as_accelerate",
    "is_installed_as_accelerate",
]

#: The release of the reference (Hugging Face Accelerate) whose public surface accelerando mirrors.
#: ``accelerate.__version__`` and ``importlib.metadata.version("accelerate")`` report it once the
#: stand-in is installed. transformers needs >= 1.1.0 (1.12.0 for ``ParallelismConfig``), peft >= 0.21.0,
#: trl >= 1.10.1 (1.12.0 for its parallelism code paths).
ACCELERATE_COMPAT_VERSION = "1.15.0"

#: The import name the stand-in answers to.
STAND_IN_NAME = "accelerate"

_TARGET = "accelerando"
# Reference modules that own code which tests and scripts patch by the reference's path
# (``mock.patch("accelerate.utils.launch.which")``): accelerando's module at that path only re-exports,
# so the stand-in resolves the path to the owner module itself, where the patched name is looked up.
_MOVED_OWNERS = {"accelerate.utils.launch": "accelerando.launchers.reference"}
_PREFIX = STAND_IN_NAME + "."
_LOCK = threading.Lock()

# Attributes the ``accelerate`` view keeps for itself; every other attribute lives on accelerando.
_OWN_ATTRIBUTES = frozenset(
    {"__name__", "__spec__", "__loader__", "__package__", "__path__", "__version__", "__dict__", "__class__"}
)


class AccelerateAlreadyImportedError(ImportError):
    """The real ``accelerate`` package was imported before ``install_as_accelerate()`` ran."""


class _AccelerateView(types.ModuleType):
    """The module object behind ``import accelerate``: accelerando's namespace under another name."""

    def __getattr__(self, name: str) -> object:
        return getattr(sys.modules[_TARGET], name)

    def __setattr__(self, name: str, value: object) -> None:
        if name in _OWN_ATTRIBUTES:
            super().__setattr__(name, value)
        else:
            setattr(sys.modules[_TARGET], name, value)

    def __delattr__(self, name: str) -> None:
        if name in _OWN_ATTRIBUTES:
            super().__delattr__(name)
        else:
            delattr(sys.modules[_TARGET], name)

    def __dir__(self) -> list[str]:
        return sorted(set(dir(sys.modules[_TARGET])) | {"__version__"})

    def __repr__(self) -> str:
        return f"<module {STAND_IN_NAME!r} (accelerando stand-in, from {sys.modules[_TARGET].__file__!r})>"


class _StandInLoader(importlib.abc.Loader):
    """Hands out the existing accelerando module for each ``accelerate`` name (nothing runs twice)."""

    def __init__(self, target: str) -> None:
        self.target = target
        self._original_spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = importlib.import_module(self.target)
        if spec.name == STAND_IN_NAME:
            view = _AccelerateView(STAND_IN_NAME, module.__doc__)
            view.__version__ = ACCELERATE_COMPAT_VERSION
            view.__path__ = list(getattr(module, "__path__", []))
            return view
        # The import system overwrites ``__spec__`` on whatever create_module returns; keep the real
        # one so accelerando's module still names itself (reload, pickling by module name).
        self._original_spec = module.__spec__
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        if self._original_spec is not None and module.__name__ == self.target:
            module.__spec__ = self._original_spec
            self._original_spec = None


class _StandInFinder(importlib.abc.MetaPathFinder):
    """Resolves ``accelerate`` and ``accelerate.*`` to accelerando; first on ``sys.meta_path``."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname == STAND_IN_NAME:
            return importlib.machinery.ModuleSpec(STAND_IN_NAME, _StandInLoader(_TARGET), is_package=True)
        if not fullname.startswith(_PREFIX):
            return None
        own = _MOVED_OWNERS.get(fullname) or _TARGET + fullname[len(STAND_IN_NAME) :]
        try:
            own_spec = importlib.util.find_spec(own)
        except ModuleNotFoundError as error:
            if error.name and own.startswith(error.name + ".") and error.name.startswith(_TARGET):
                return None  # a parent package does not exist either
            raise
        if own_spec is None:
            return None  # later finders search the same folders, so they find nothing either
        is_package = own_spec.submodule_search_locations is not None
        return importlib.machinery.ModuleSpec(fullname, _StandInLoader(own), is_package=is_package)

    def find_distributions(
        self, context: importlib.metadata.DistributionFinder.Context | None = None
    ) -> Iterable[importlib.metadata.Distribution]:
        """Report the stand-in's ``accelerate`` distribution (before any installed one)."""
        name = getattr(context, "name", None)
        if name is None or _normalize(name) == STAND_IN_NAME:
            return iter([_StandInDistribution()])
        return iter(())


def _normalize(name: str) -> str:
    return name.lower().replace("-", "_").replace(".", "_")


class _StandInDistribution(importlib.metadata.Distribution):
    """Metadata for the ``accelerate`` distribution that accelerando stands in for."""

    _FILES = {
        "METADATA": (
            "Metadata-Version: 2.1\n"
            f"Name: {STAND_IN_NAME}\n"
            f"Version: {ACCELERATE_COMPAT_VERSION}\n"
            "Summary: accelerando standing in for accelerate\n"
            "Requires-Python: >=3.10\n"
        ),
        "top_level.txt": STAND_IN_NAME + "\n",
        "entry_points.txt": (
            "[console_scripts]\naccelerate = accelerando.commands.accelerate_cli:accelerate_console_main\n"
        ),
        "INSTALLER": "accelerando\n",
    }

    def read_text(self, filename: str) -> str | None:
        return self._FILES.get(filename)

    def locate_file(self, path: str | os.PathLike[str]) -> pathlib.Path:
        import pathlib

        return pathlib.Path(os.path.dirname(os.path.abspath(__file__))) / path


def _real_accelerate_loaded() -> types.ModuleType | None:
    module = sys.modules.get(STAND_IN_NAME)
    if module is None or isinstance(module, _AccelerateView):
        return None
    return module


def _alias_loggers() -> None:
    """Make the logger ``accelerate.X`` the logger ``accelerando.X``, as the module names are aliased.

    Code written for the reference listens on its logger names (``logging.getLogger("accelerate.big_modeling")``,
    ``assertLogs("accelerate.utils.environment")``); accelerando's modules log under their own names.
    """
    manager = logging.Logger.manager
    if getattr(manager, "_accelerando_stand_in", False):
        return
    resolve = manager.getLogger

    def get_logger(name: str) -> logging.Logger:
        if name == STAND_IN_NAME or name.startswith(_PREFIX):
            name = _TARGET + name[len(STAND_IN_NAME) :]
        return resolve(name)

    manager.getLogger = get_logger  # type: ignore[method-assign]
    manager._accelerando_stand_in = True  # type: ignore[attr-defined]


def is_installed_as_accelerate() -> bool:
    """Whether :func:`install_as_accelerate` has run in this process (never raises)."""
    return any(isinstance(finder, _StandInFinder) for finder in sys.meta_path)


def install_as_accelerate() -> None:
    """Make ``import accelerate`` (and every ``accelerate.X.Y``) resolve to accelerando.

    Places a finder first on ``sys.meta_path``; see the module docstring for what then holds.
    Calling it again does nothing. Call it before importing transformers, peft, trl or anything
    else that imports ``accelerate``.

    Raises:
        AccelerateAlreadyImportedError: the real ``accelerate`` package is already imported in this
            process; call ``install_as_accelerate()`` first thing (before importing transformers and
            friends), or launch with ``accelerando launch --install_as_accelerate``.
    """
    with _LOCK:
        real = _real_accelerate_loaded()
        if real is not None:
            where = getattr(real, "__file__", None) or "an unknown location"
            raise AccelerateAlreadyImportedError(
                f"the real 'accelerate' package (from {where}) is already imported in this process, so "
                "accelerando cannot stand in for it. Call accelerando.install_as_accelerate() before "
                "anything imports accelerate (put it first in your script, before importing transformers, "
                "peft or trl), or launch with `accelerando launch --install_as_accelerate`.",
                name=STAND_IN_NAME,
            )
        if is_installed_as_accelerate():
            return
        sys.meta_path.insert(0, _StandInFinder())
        _alias_loggers()
        # Names cached as "not found" (or found elsewhere) before the finder existed.
        importlib.invalidate_caches()
