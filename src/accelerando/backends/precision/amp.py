"""Automatic mixed precision: fp16 (with loss scaling) and bf16 through ``torch.autocast``."""

from __future__ import annotations

import contextlib
import functools
from typing import Any

import torch
from typing_extensions import override

from accelerando.backends.precision.base import Precision
from accelerando.common.operations import convert_to_fp32

__all__ = ["AMPPrecision"]


class AMPPrecision(Precision):
    """Run forward passes under ``torch.autocast``; for fp16, scale the loss with a GradScaler.

    Parameters and optimizer state stay fp32; only activations are computed in the low dtype. Under
    fp16 the decision to skip a step (inf/nan gradients) is made identically on every process: the
    scaler's found-inf flags are max-reduced across processes before the step.

    Args:
        dtype: ``torch.float16`` or ``torch.bfloat16``.
        device_type: torch device type the model runs on ("cpu", "cuda", ...).
        scaler_kwargs: ``GradScalerKwargs`` fields (fp16 only).
        static_scale: keep the initial scale for the whole run.
        autocast_kwargs: ``AutocastKwargs`` fields (``enabled``, ``cache_enabled``).
        loss_scaling: create the fp16 GradScaler (False when an engine scales the loss itself).

    Raises:
        ValueError: fp16 requested on a device where autocast does not support it.
    """

    def __init__(
        self,
        dtype: torch.dtype,
        device_type: str,
        # Any: GradScaler's and torch.autocast's own keywords, passed on as given.
        scaler_kwargs: dict[str, Any] | None = None,
        static_scale: bool = False,
        autocast_kwargs: dict[str, Any] | None = None,
        loss_scaling: bool = True,
    ) -> None:
        self.dtype = dtype
        self.device_type = device_type
        self.name = "fp16" if dtype == torch.float16 else "bf16"
        self.autocast_kwargs = {k: v for k, v in (autocast_kwargs or {}).items() if v is not None}
        if not torch.amp.autocast_mode.is_autocast_available(device_type):
            raise ValueError(
                f"mixed_precision={self.name!r} needs torch.autocast on {device_type!r}, which this PyTorch "
                "does not support; use mixed_precision='no' or another device"
            )
        self.scaler: torch.amp.GradScaler | None = None
        self._static_scale: float | None = None
        if self.name == "fp16" and loss_scaling:
            kwargs = dict(scaler_kwargs or {})
            self.scaler = torch.amp.GradScaler(device_type, **kwargs)
            if static_scale:
                self._static_scale = float(kwargs.get("init_scale", 65536.0))

    def convert_module(self, model: torch.nn.Module) -> torch.nn.Module:
        """Wrap ``model.forward`` in autocast and cast its floating outputs back to fp32.

        The original forward is kept as ``model._accelerando_original_forward`` so that
        ``unwrap_model(keep_fp32_wrapper=False)`` can restore it.
        """
        if getattr(model, "_accelerando_original_forward", None) is not None:
            return model

        original = model.forward
        device_type, dtype, kwargs = self.device_type, self.dtype, self.autocast_kwargs

        @functools.wraps(original)
        def forward(*args: object, **kw: object) -> object:
            with torch.autocast(device_type=device_type, dtype=dtype, **kwargs):
                outputs = original(*args, **kw)
            return convert_to_fp32(outputs)

        model.forward = forward  # type: ignore[method-assign]
        model._accelerando_original_forward = original  # type: ignore[assignment]
        return model

    @override
    def autocast(
        self, enabled: bool = True, cache_enabled: bool | None = None
    ) -> contextlib.AbstractContextManager:
        kwargs = dict(self.autocast_kwargs)
        if cache_enabled is not None:
            kwargs["cache_enabled"] = cache_enabled
        kwargs["enabled"] = enabled and kwargs.get("enabled", True)
        return torch.autocast(device_type=self.device_type, dtype=self.dtype, **kwargs)

    @override
    # Any: Tensor.backward's own keywords (retain_graph, create_graph...), passed on as given.
    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        if self.scaler is not None:
            self.scaler.scale(loss).backward(**kwargs)
        else:
            loss.backward(**kwargs)

    @override
    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        if self.scaler is None:
            return
        # torch 2.13: torch/amp/grad_scaler.py:559 (private; has this optimizer been unscaled this step?)
        state = self.scaler._per_optimizer_states[id(optimizer)]
        # Unscaling twice in one step raises inside GradScaler; clipping then stepping does both.
        if state["stage"].name != "UNSCALED":
            self.scaler.unscale_(optimizer)

    @override
    def optimizer_step(self, optimizer: torch.optim.Optimizer, **kwargs: Any) -> bool:
        if self.scaler is None:
            optimizer.step(**kwargs)
            return True
        self.unscale_(optimizer)
        self._agree_on_overflow(optimizer)
        scale_before = self.scaler.get_scale()
        found_inf = self._found_inf(optimizer)
        self.scaler.step(optimizer, **kwargs)
        if self._static_scale is not None:
            self.scaler.update(new_scale=self._static_scale)
        else:
            self.scaler.update()
        if found_inf is not None:
            return not found_inf
        return self.scaler.get_scale() >= scale_before

    # torch 2.13: torch/amp/grad_scaler.py:559 (private; the scaler's found-inf flags per device)
    def _found_inf(self, optimizer: torch.optim.Optimizer) -> bool | None:
        flags = self.scaler._per_optimizer_states[id(optimizer)].get("found_inf_per_device", {})  # type: ignore[union-attr]
        if not flags:
            return None
        return bool(sum(float(v.item()) for v in flags.values()))

    def _agree_on_overflow(self, optimizer: torch.optim.Optimizer) -> None:
        # After DDP's all-reduce every process has the same gradients, but a process can still see
        # an overflow the others do not (gradients modified after backward, no_sync steps, FSDP
        # shards). Max-reducing the flags keeps every replica's skip decision identical.
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return
        # torch 2.13: torch/amp/grad_scaler.py:559 (private; the flags every process max-reduces)
        flags = self.scaler._per_optimizer_states[id(optimizer)].get("found_inf_per_device", {})  # type: ignore[union-attr]
        for device, flag in flags.items():
            reduced = flag.clone()
            dist.all_reduce(reduced, op=dist.ReduceOp.MAX)
            flags[device] = reduced

    @override
    def state_dict(self) -> dict[str, object]:
        return self.scaler.state_dict() if self.scaler is not None else {}

    @override
    def load_state_dict(self, state: dict[str, object]) -> None:
        if self.scaler is not None and state:
            self.scaler.load_state_dict(state)
