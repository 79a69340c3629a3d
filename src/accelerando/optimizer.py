"""AcceleratedOptimizer: an optimizer that steps only when gradients are synchronised."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from typing_extensions import override

from accelerando.gradient_state import GradientState

__all__ = ["AcceleratedOptimizer", "move_to_device", "patch_optimizer_step"]


def _move_state_to(optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    for state in optimizer.state.values():
        for key, value in state.items():
            # "step" counters stay where PyTorch keeps them (CPU) unless capturable.
            if isinstance(value, torch.Tensor) and key != "step" and value.device != device:
                state[key] = value.to(device)


def move_to_device(state: Any, device: torch.device | str) -> Any:
    """Return ``state`` (nested lists, tuples, dicts of tensors) with every tensor moved to ``device``.

    Containers are rebuilt with the same types; values that are not tensors are returned as they are.
    """
    if isinstance(state, torch.Tensor):
        return state.to(device)
    if isinstance(state, dict):
        return type(state)({key: move_to_device(value, device) for key, value in state.items()})
    if isinstance(state, tuple) and hasattr(state, "_fields"):  # namedtuple
        return type(state)(*(move_to_device(value, device) for value in state))
    if isinstance(state, (list, tuple)):
        return type(state)(move_to_device(value, device) for value in state)
    return state


def patch_optimizer_step(
    accelerated_optimizer: AcceleratedOptimizer, method: Callable[..., Any]
) -> Callable[..., Any]:
    """Wrap an optimizer's ``step`` so that calling it marks ``accelerated_optimizer`` as stepped.

    A loss scaler that skips a step never calls the real ``step``; the mark tells the two apart.
    """

    @functools.wraps(method)
    def patched_step(*args: Any, **kwargs: Any) -> Any:
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
    _snapshot_wait: Callable[[], Any] | None = None

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        device_placement: bool = True,
        scaler: Any = None,
        precision: Any = None,
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
        self._after_step: Any = None
        if device_placement and device is not None and device.type != "cpu":
            _move_state_to(optimizer, device)

    @override
    @property
    def state(self) -> Any:  # type: ignore[override]
        return self.optimizer.state

    @override
    @state.setter
    def state(self, value: Any) -> None:
        self.optimizer.state = value

    @override
    @property
    def param_groups(self) -> list[dict[str, Any]]:  # type: ignore[override]
        return self.optimizer.param_groups

    @override
    @param_groups.setter
    def param_groups(self, value: list[dict[str, Any]]) -> None:
        self.optimizer.param_groups = value

    @override
    @property
    def defaults(self) -> dict[str, Any]:  # type: ignore[override]
        return self.optimizer.defaults

    @override
    @defaults.setter
    def defaults(self, value: dict[str, Any]) -> None:
        self.optimizer.defaults = value

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a parameter group to the wrapped optimizer."""
        self.optimizer.add_param_group(param_group)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:  # type: ignore[override]
        """Load the wrapped optimizer's state (torch puts each tensor on its parameter's device)."""
        self.optimizer.load_state_dict(state_dict)

    def state_dict(self) -> dict[str, Any]:  # type: ignore[override]
        """The wrapped optimizer's state dict."""
        return self.optimizer.state_dict()

    def zero_grad(self, set_to_none: bool | None = None) -> None:
        """Clear gradients, except while accumulating (they must add up).

        ``set_to_none`` None keeps torch's default (gradients set to None).
        """
        if self.gradient_state.sync_gradients:
            self.optimizer.zero_grad(set_to_none=True if set_to_none is None else set_to_none)

    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
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
        if hasattr(self.optimizer, "train"):
            self.optimizer.train()

    def eval(self) -> None:
        """Forward ``eval()`` to optimizers that have modes (schedule-free optimizers)."""
        if self._snapshot_wait is not None:
            self._snapshot_wait()  # switching modes rewrites the parameters
        if hasattr(self.optimizer, "eval"):
            self.optimizer.eval()

    @property
    def step_was_skipped(self) -> bool:
        """Whether the last optimizer step was skipped because of inf/nan gradients."""
        return self._is_overflow

    @property
    def is_overflow(self) -> bool:
        """Alias of ``step_was_skipped``."""
        return self._is_overflow

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("gradient_state", "_snapshot_wait")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.gradient_state = GradientState()

    def __repr__(self) -> str:
        return f"AcceleratedOptimizer({self.optimizer!r})"
