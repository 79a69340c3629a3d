"""A progress bar shown once per machine: ``tqdm`` that stays silent on all but the local main process."""

from __future__ import annotations

import types
from collections.abc import Iterable, Sized
from typing import TYPE_CHECKING, Any, TypeVar

from accelerando.common.imports import is_tqdm_available
from accelerando.logging import _process_view

if TYPE_CHECKING:
    from tqdm.std import tqdm as ProgressBar

__all__ = ["CallableProgressModule", "tqdm", "progress"]

_T = TypeVar("_T")


# The arguments go to tqdm's own constructor unchanged, so they take its (many, per-position) types.
def tqdm(*args: Any, main_process_only: bool = True, **kwargs: Any) -> ProgressBar:
    """Build a ``tqdm.auto.tqdm`` bar that only the local main process displays.

    Args:
        *args: passed to ``tqdm`` (usually the iterable).
        main_process_only: show the bar on the local main process only (``LOCAL_RANK`` 0); other
            processes get a disabled bar that still iterates.
        **kwargs: passed to ``tqdm`` (``total``, ``desc``, ``disable``, ...).

    Returns:
        The ``tqdm`` object.

    Raises:
        ImportError: ``tqdm`` is not installed.
        TypeError: a bool was passed as the first positional argument (an old calling convention);
            use ``main_process_only=...`` instead.
    """
    if not is_tqdm_available():
        raise ImportError("accelerando.utils.tqdm needs the tqdm package: `pip install tqdm`.")
    if args and isinstance(args[0], bool):
        raise TypeError(
            "tqdm() got a bool as its first argument; pass the iterable first and the flag by name: "
            "tqdm(iterable, main_process_only=True)."
        )
    from tqdm.auto import tqdm as _tqdm

    disable = bool(kwargs.pop("disable", False))
    if main_process_only and _process_view().local_rank != 0:
        disable = True
    return _tqdm(*args, disable=disable, **kwargs)


def progress(iterable: Iterable[_T], desc: str, total: int | None = None, min_items: int = 2) -> Iterable[_T]:
    """Wrap the library's own long loops in a main-process progress bar.

    Returns ``iterable`` unchanged when tqdm is not installed, when there are fewer than
    ``min_items`` items, or when ``ACCELERANDO_DISABLE_PROGRESS_BARS``-style disabling is in effect
    through tqdm's own ``TQDM_DISABLE`` variable.
    """
    if total is None and isinstance(iterable, Sized):
        try:
            total = len(iterable)
        except TypeError:
            total = None
    if not is_tqdm_available() or (total is not None and total < min_items):
        return iterable
    return tqdm(iterable, desc=desc, total=total, leave=False)


class CallableProgressModule(types.ModuleType):
    """A module that, called, builds a progress bar: the class of ``accelerando.utils.tqdm``.

    In the reference, ``accelerate.utils.tqdm`` names the function although a submodule has the same
    name; giving the module this class makes ``accelerando.utils.tqdm(range(3))`` work whichever of
    the two a lookup finds first.
    """

    def __call__(self, *args: Any, main_process_only: bool = True, **kwargs: Any) -> ProgressBar:
        """Build a progress bar, as ``accelerando.utils.tqdm(...)`` does."""
        return tqdm(*args, main_process_only=main_process_only, **kwargs)
