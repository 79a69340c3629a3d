"""AcceleratedOptimizer: an optimizer that steps only when gradients are synchronised."""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Callable
from typing import ParamSpec, Protocol, TypeVar, cast

import torch
from typing_extensions import override

from accelerando.core.gradient_state import GradientState

__all__ = ["AcceleratedOptimizer", "move_to_device", "patch_optimizer_step"]

T = TypeVar("T")
P = ParamSpec("P")
R = TypeVar("R")


class _SteppingPrecision(Protocol):
    """What the optimizer uses of a precision (``backends.precision.base.Precision``, a layer above)."""

    def optimizer_step(self, optimizer: torch.optim.Optimizer, **kwargs: object) -> bool:
        """Step ``optimizer`` (unscaling first under a loss scaler); False when the step was skipped."""
        ...


def _move_state_to(optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    for state in optimizer.state.values():
        for key, value in state.items():
            # "step" counters stay where PyTorch keeps them (CPU) unless capturable.
            if isinstance(value, torch.Tensor) and key != "step" and value.device != device:
                state[key] = value.to(device)


def move_to_device(state: T, device: torch.device | str) -> T:
    """Return ``state`` (nested lists, tuples, dicts of tensors) with every tensor moved to ``device``.

    Containers are rebuilt with the same types; values that are not tensors are returned as they are.
    """
    # Every branch of _moved rebuilds its input's own type, so the result has the type of ``state``.
    return cast(T, _moved(state, device))


def _build(cls: Callable[..., T], *fields: object) -> T:
    return cls(*fields)


def _moved(state: object, device: torch.device | str) -> object:
    if isinstance(state, torch.Tensor):
        return state.to(device)
    if isinstance(state, dict):
        return type(state)({key: _moved(value, device) for key, value in state.items()})
    if isinstance(state, tuple) and hasattr(state, "_fields"):  # namedtuple: built from its fields
        return _build(type(state), *(_moved(value, device) for value in state))
    if isinstance(state, (list, tuple)):
        return type(state)(_moved(value, device) for value in state)
    return state


def patch_optimizer_step(
    accelerated_optimizer: AcceleratedOptimizer, method: Callable[P, R]
) -> Callable[P, R]:
    """Wrap an optimizer's ``step`` so that calling it marks ``accelerated_optimizer`` as stepped.

    A loss scaler that skips a step never calls the real ``step``; the mark tells the two apart.
    """

    @functools.wraps(method)
    def patched_step(*args: P.args, **kwargs: P.kwargs) -> R:
        accelerated_optimizer._accelerate_step_called = True
        return method(*args, **kwargs)

    return patched_step


class AcceleratedOptimizer(torch.optim.Optimizer):
    """Wraps a torch optimizer for accumulation and mixed precision.

    ``step()`` and ``zero_grad()`` do nothing while gradients are being accumulated (a non-sync
    micro-batch); on sync steps ``step()`` goes through the precision plugin, which unscales and may
    skip the step on overflow (then ``step_was_skipped`` is True). Everything else (param_groups,
    state, state_dict, add_param_group) is the wrapped optimizer's.

    Args:
        optimizer: the user's optimizer.
        device_placement: move existing optimizer state to the model's device.
        scaler: accepted for compatibility; the precision plugin owns the scaler.
        precision: the Accelerator's precision plugin (plain ``optimizer.step`` when None).
        device: where the state should live when ``device_placement``.
    """

    # Set by an asynchronous save while it still copies the parameters and optimizer state
    # (accelerando.checkpointing.async_save): step() waits for it. None, the usual case, costs one read.
    _snapshot_wait: Callable[[], object] | None = None

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        device_placement: bool = True,
        scaler: torch.amp.GradScaler | None = None,
        precision: _SteppingPrecision | None = None,
        device: torch.device | None = None,
    ) -> None:
        # torch.optim.Optimizer.__init__ is deliberately not called: this object holds no params of
        # its own and forwards attribute access to the wrapped optimizer.
        self.optimizer = optimizer
        self.scaler = scaler
        self._precision = precision
        self.gradient_state = GradientState()
        self.device_placement = device_placement
        self._is_overflow = False
        self._accelerate_step_called = False
        # Optional callback after each real step (the memory monitor); None costs one check.
        self._after_step: Callable[[], object] | None = None
        if device_placement and device is not None and device.type != "cpu":
            _move_state_to(optimizer, device)

    @property
    @override
    def state(self) -> defaultdict[torch.Tensor, dict[str, object]]:  # type: ignore[override]
        return self.optimizer.state

    @state.setter
    @override
    def state(self, value: defaultdict[torch.Tensor, dict[str, object]]) -> None:
        self.optimizer.state = value

    @property
    @override
    def param_groups(self) -> list[dict[str, object]]:  # type: ignore[override]
        return self.optimizer.param_groups

    @param_groups.setter
    @override
    def param_groups(self, value: list[dict[str, object]]) -> None:
        self.optimizer.param_groups = value

    @property
    @override
    def defaults(self) -> dict[str, object]:  # type: ignore[override]
        return self.optimizer.defaults

    @defaults.setter
    @override
    def defaults(self, value: dict[str, object]) -> None:
        self.optimizer.defaults = value

    def add_param_group(self, param_group: dict[str, object]) -> None:
        """Add a parameter group to the wrapped optimizer."""
        self.optimizer.add_param_group(param_group)

    def load_state_dict(self, state_dict: dict[str, object]) -> None:  # type: ignore[override]
        """Load the wrapped optimizer's state (torch puts each tensor on its parameter's device)."""
        self.optimizer.load_state_dict(state_dict)

    def state_dict(self) -> dict[str, object]:  # type: ignore[override]
        """The wrapped optimizer's state dict."""
        return self.optimizer.state_dict()

    def zero_grad(self, set_to_none: bool | None = None) -> None:
        """Clear gradients, except while accumulating (they must add up).

        ``set_to_none`` None keeps torch's default (gradients set to None).
        """
        if self.gradient_state.sync_gradients:
            self.optimizer.zero_grad(set_to_none=True if set_to_none is None else set_to_none)

    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        """Step on sync micro-batches only; records whether the loss scaler skipped it."""
        if not self.gradient_state.sync_gradients:
            return None
        if self._snapshot_wait is not None:
            self._snapshot_wait()  # an asynchronous save is still copying the parameters
        self._accelerate_step_called = True
        if self._precision is None:
            self._is_overflow = False
            result = self.optimizer.step(closure) if closure is not None else self.optimizer.step()
            if self._after_step is not None:
                self._after_step()
            return result
        kwargs = {"closure": closure} if closure is not None else {}
        self._is_overflow = not self._precision.optimizer_step(self.optimizer, **kwargs)
        if self._after_step is not None:
            self._after_step()
        return None

    def train(self) -> None:
        """Forward ``train()`` to optimizers that have modes (schedule-free optimizers)."""
        if self._snapshot_wait is not None:
            self._snapshot_wait()  # switching modes rewrites the parameters
        train = getattr(self.optimizer, "train", None)
        if train is not None:
            train()

    def eval(self) -> None:
        """Forward ``eval()`` to optimizers that have modes (schedule-free optimizers)."""
        if self._snapshot_wait is not None:
            self._snapshot_wait()  # switching modes rewrites the parameters
        evaluate = getattr(self.optimizer, "eval", None)
        if evaluate is not None:
            evaluate()

    @property
    def step_was_skipped(self) -> bool:
        """Whether the last optimizer step was skipped because of inf/nan gradients."""
        return self._is_overflow

    @property
    def is_overflow(self) -> bool:
        """Alias of ``step_was_skipped``."""
        return self._is_overflow

    def __getstate__(self) -> dict[str, object]:
        return {k: v for k, v in self.__dict__.items() if k not in ("gradient_state", "_snapshot_wait")}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self.gradient_state = GradientState()

    def __repr__(self) -> str:
        return f"AcceleratedOptimizer({self.optimizer!r})"
