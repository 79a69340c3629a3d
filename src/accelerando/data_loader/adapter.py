"""The reference's loader building blocks: ``DataLoaderStateMixin``, ``DataLoaderAdapter``, ``get_sampler``.

Prepared loaders (``DataLoaderShard``, ``DataLoaderDispatcher``) are ``DataLoader`` subclasses and
carry the mixin; the adapter is for code that wraps an existing loader object instead.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Protocol, TypeGuard, TypeVar

from torch.utils.data import BatchSampler, DataLoader

from accelerando.common.imports import is_torchdata_stateful_dataloader_available
from accelerando.core.gradient_state import GradientState

if TYPE_CHECKING:
    from torch.utils.data import Dataset
    from typing_extensions import Self, Unpack

    from accelerando.data_loader._typing import DataLoaderOptions

__all__ = ["DataLoaderAdapter", "DataLoaderStateMixin", "get_sampler", "set_sampler", "with_stateful_base"]

_C = TypeVar("_C")
_Owner = TypeVar("_Owner")


class _SavesState(Protocol):
    def state_dict(self) -> dict[str, object]: ...


class _LoadsState(Protocol):
    def load_state_dict(self, state_dict: dict[str, object], /) -> object: ...


def _saves_state(loader: object) -> TypeGuard[_SavesState]:
    """Whether ``loader`` has a ``state_dict`` (torchdata's ``StatefulDataLoader`` does, a ``DataLoader`` not)."""
    return hasattr(loader, "state_dict")


def _loads_state(loader: object) -> TypeGuard[_LoadsState]:
    return hasattr(loader, "load_state_dict")


def get_sampler(dataloader: object) -> object:
    """Return the index sampler a loader draws from (under its batch sampler), or None.

    Args:
        dataloader: A ``DataLoader`` (plain or prepared) or anything with ``sampler`` / ``batch_sampler``.
    """
    outer = getattr(dataloader, "sampler", None)
    if isinstance(outer, BatchSampler):  # a batch sampler passed as ``sampler`` (batch_size=None)
        return getattr(outer, "sampler", None)
    return getattr(getattr(dataloader, "batch_sampler", None), "sampler", None)


def set_sampler(dataloader: object, sampler: Iterable[int]) -> None:
    """Make ``dataloader`` draw its indices from ``sampler`` (at every batch-sampler level it has).

    Raises:
        ValueError: When the loader has no batch sampler to put the sampler into.
    """
    outer = getattr(dataloader, "sampler", None)
    if isinstance(outer, BatchSampler):
        outer.sampler = sampler
        inner = getattr(outer, "batch_sampler", None)
        if inner is not None:
            inner.sampler = sampler
        return
    batch_sampler = getattr(dataloader, "batch_sampler", None)
    if batch_sampler is None:
        raise ValueError(
            "This loader has no batch sampler (batch_size=None), so there is no sampler to replace; "
            "build a new DataLoader with the sampler instead."
        )
    batch_sampler.sampler = sampler
    inner = getattr(batch_sampler, "batch_sampler", None)
    if inner is not None:
        inner.sampler = sampler


_STATEFUL_VARIANTS: dict[type, type] = {}


def _combined(cls: type, base: type) -> type:
    """A subclass of ``cls`` and ``base`` that presents itself as ``cls`` (name, module, docstring)."""
    namespace = {"__module__": cls.__module__, "__doc__": cls.__doc__, "__qualname__": cls.__qualname__}
    return type(cls.__name__, (cls, base), namespace)


def with_stateful_base(cls: type[_C]) -> type[_C]:
    """Return ``cls`` combined with torchdata's ``StatefulDataLoader`` when torchdata is installed.

    The combination passes ``isinstance(loader, StatefulDataLoader)`` checks (as with the reference
    library); iteration and ``state_dict`` stay ours, and iterable data resumes through torchdata's
    state instead of reading through. Without torchdata, ``cls`` itself is returned.

    Args:
        cls: ``DataLoaderShard``, ``DataLoaderDispatcher`` or ``SkipDataLoader`` (a variant is
            returned as it is).

    Returns:
        The class to instantiate.
    """
    if not is_torchdata_stateful_dataloader_available():
        return cls
    from torchdata.stateful_dataloader import StatefulDataLoader

    if issubclass(cls, StatefulDataLoader):
        return cls
    if cls not in _STATEFUL_VARIANTS:
        _STATEFUL_VARIANTS[cls] = _combined(cls, StatefulDataLoader)
    variant = _STATEFUL_VARIANTS[cls]
    assert issubclass(variant, cls)  # built above as a subclass of cls
    return variant


class _SelfAsBase:
    """``loader.base_dataloader``: the loader itself (a prepared loader is the ``DataLoader``, or the
    torchdata ``StatefulDataLoader``, it would wrap). Read on the class, it is missing, as with the
    reference library, whose loaders set it per instance.
    """

    def __get__(self, instance: _Owner | None, owner: type | None = None) -> _Owner:
        if instance is None:
            raise AttributeError("base_dataloader is set on each loader, not on its class")
        return instance


class DataLoaderStateMixin:
    """Tells ``GradientState`` which loader is running and whether its last batch was given out.

    ``end_of_dataloader`` turns True when the last batch of the iteration is given out; ``remainder``
    is the number of real samples in the final global batch when it was padded to even sizes (-1
    when unknown or not padded). A subclass calls ``begin()`` when an iteration starts and
    ``end()`` when it stops.
    """

    end_of_dataloader: bool = False
    remainder: int = -1
    base_dataloader = _SelfAsBase()

    def __new__(cls, *args: object, use_stateful_dataloader: bool = False, **kwargs: object) -> Self:
        """With ``use_stateful_dataloader=True``, build the class combined with torchdata's
        ``StatefulDataLoader`` (see ``with_stateful_base``), so ``isinstance`` checks against it hold.
        """
        target = with_stateful_base(cls) if use_stateful_dataloader else cls
        return super().__new__(target)

    @property
    def gradient_state(self) -> GradientState:
        """The process's ``GradientState`` (a view of the shared state; holding it keeps nothing alive)."""
        return GradientState()

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        cls.end_of_dataloader = False
        cls.remainder = -1

    def reset(self) -> None:
        """Forget the previous iteration's end state."""
        self.end_of_dataloader = False
        self.remainder = -1

    def begin(self) -> None:
        """Reset and register with ``GradientState`` (its ``end_of_dataloader`` then follows this loader)."""
        self.reset()
        GradientState()._add_dataloader(self)

    def end(self) -> None:
        """Unregister from ``GradientState``."""
        GradientState()._remove_dataloader(self)


class DataLoaderAdapter:
    """Wraps a ``DataLoader`` (or torchdata's ``StatefulDataLoader``) and acts as it.

    Every attribute not defined here is read from the wrapped loader (``base_dataloader``), and
    ``isinstance(adapter, DataLoader)`` holds through ``__class__``.

    Args:
        dataset: The dataset.
        use_stateful_dataloader: Build a torchdata ``StatefulDataLoader`` (needs ``torchdata``).
        batch_sampler: Passed to the loader.
        **kwargs: Everything ``DataLoader`` accepts.

    Raises:
        ImportError: With ``use_stateful_dataloader`` when torchdata (>= 0.8) is not installed.
    """

    def __init__(
        self,
        dataset: Dataset[object],
        use_stateful_dataloader: bool = False,
        batch_sampler: Iterable[list[int]] | None = None,
        **kwargs: Unpack[DataLoaderOptions],
    ) -> None:
        self.use_stateful_dataloader = bool(use_stateful_dataloader)
        if self.use_stateful_dataloader:
            if not is_torchdata_stateful_dataloader_available():
                raise ImportError(
                    "use_stateful_dataloader=True needs torchdata >= 0.8 (pip install torchdata); install it "
                    "or set use_stateful_dataloader=False."
                )
            from torchdata.stateful_dataloader import StatefulDataLoader

            self.base_dataloader: DataLoader[object] = StatefulDataLoader(
                dataset, batch_sampler=batch_sampler, **kwargs
            )
        else:
            self.base_dataloader = DataLoader(dataset, batch_sampler=batch_sampler, **kwargs)
        self.dl_state_dict: dict[str, object] = {}

    def __getattr__(self, name: str) -> object:
        if name == "base_dataloader":  # not set yet (during unpickling): avoid endless recursion
            raise AttributeError(name)
        return getattr(self.base_dataloader, name)

    def __iter__(self) -> Iterator[object]:
        return iter(self.base_dataloader)

    def __len__(self) -> int:
        return len(self.base_dataloader)

    @property
    def __class__(self) -> type:  # type: ignore[override]
        """The wrapped loader's class, so ``isinstance(adapter, DataLoader)`` checks pass."""
        return self.base_dataloader.__class__

    def state_dict(self) -> dict[str, object]:
        """The wrapped stateful loader's state (as of the last batch given out).

        Raises:
            TypeError: When the wrapped loader is a plain ``DataLoader`` (it has no state).
        """
        loader = self.base_dataloader
        if not _saves_state(loader):
            raise TypeError(
                "This loader was built without use_stateful_dataloader=True, so it has no state_dict; "
                "rebuild it with use_stateful_dataloader=True (needs torchdata)."
            )
        return self.dl_state_dict or loader.state_dict()

    def load_state_dict(self, state_dict: dict[str, object]) -> None:
        """Restore a state returned by ``state_dict``.

        Raises:
            TypeError: When the wrapped loader is a plain ``DataLoader``.
        """
        loader = self.base_dataloader
        if not _loads_state(loader):
            raise TypeError(
                "This loader was built without use_stateful_dataloader=True, so it cannot load a state; "
                "rebuild it with use_stateful_dataloader=True (needs torchdata)."
            )
        loader.load_state_dict(state_dict)

    def _update_state_dict(self) -> None:
        """Record the wrapped loader's state now (call right after giving out a batch)."""
        loader = self.base_dataloader
        if _saves_state(loader):
            self.dl_state_dict = loader.state_dict()
            self.adjust_state_dict_for_prefetch()

    def adjust_state_dict_for_prefetch(self) -> None:
        """Hook to correct ``dl_state_dict`` when batches are read ahead of those given out.

        The adapter records the state right after each batch it gives out, so nothing was read
        ahead and there is nothing to correct; a subclass that reads ahead overrides this.
        """
