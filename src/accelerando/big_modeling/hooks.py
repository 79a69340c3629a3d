"""Hooks that run around a module's forward: move inputs, load offloaded weights, cast dtypes.

Contract: :func:`add_hook_to_module` replaces ``module.forward`` with a wrapper that calls
``hook.pre_forward(module, *args, **kwargs) -> (args, kwargs)``, the original forward, then
``hook.post_forward(module, output) -> output``. The hook is stored as ``module._hf_hook`` and the
original forward as ``module._old_forward`` (the attribute names other libraries look for).
:func:`remove_hook_from_module` calls ``hook.detach_hook(module)`` and restores the original forward
exactly (an instance-level forward is put back; otherwise the class method shows through again).
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar, cast

import torch
from torch import nn
from typing_extensions import override

from accelerando.big_modeling.sizes import named_module_tensors
from accelerando.big_modeling.tensors import set_module_tensor_to_device, to_torch_device

__all__ = [
    "AlignDevicesHook",
    "CpuOffload",
    "LayerwiseCastingHook",
    "ModelHook",
    "SequentialHook",
    "UserCpuOffloadHook",
    "add_hook_to_module",
    "align_module_device",
    "has_offloaded_params",
    "remove_hook_from_module",
    "remove_hook_from_submodules",
    "send_to_device",
]

T = TypeVar("T")
_MISSING = object()
# Methods dispatch_model overrides on the instance to refuse moves while hooks are attached.
_MOVE_METHODS = ("to", "cuda", "cpu", "xpu", "npu", "mps", "half", "float", "bfloat16", "double")


def send_to_device(
    data: T,
    device: torch.device | None,
    non_blocking: bool = False,
    skip_keys: str | Sequence[str] | None = None,
) -> T:
    """Move every tensor in a (nested) structure of lists, tuples, dicts and namedtuples to ``device``.

    Args:
        data: the structure; objects with a ``to`` method (such as tokenizer outputs) are moved too.
        device: the target; None leaves ``data`` unchanged.
        non_blocking: passed to ``Tensor.to``.
        skip_keys: dict keys (a name or a list of names) whose values are left where they are.

    Returns:
        The same structure with moved tensors.
    """
    if device is None:
        return data
    skip = [skip_keys] if isinstance(skip_keys, str) else skip_keys
    # The walk rebuilds each container with its own type, so the result has the type of ``data``.
    return cast("T", _moved(data, device, non_blocking, skip))


def _construct(cls: Callable[..., object], *args: object) -> object:
    # The container types are only known at run time; a class is called like any factory.
    return cls(*args)


def _moved(data: object, device: torch.device, non_blocking: bool, skip_keys: Sequence[str] | None) -> object:
    if isinstance(data, torch.Tensor):
        return data if data.device == device else data.to(device, non_blocking=non_blocking)
    if isinstance(data, (list, tuple)):
        moved = [_moved(item, device, non_blocking, skip_keys) for item in data]
        if hasattr(data, "_fields"):  # namedtuple
            return _construct(type(data), *moved)
        return type(data)(moved) if type(data) in (list, tuple) else moved
    if isinstance(data, Mapping):
        skip = set(skip_keys or ())
        items = {k: v if k in skip else _moved(v, device, non_blocking, skip_keys) for k, v in data.items()}
        try:
            return _construct(type(data), items)
        except TypeError:
            return items
    to = getattr(data, "to", None)
    if to is not None and not isinstance(data, nn.Module):
        try:
            return to(device, non_blocking=non_blocking)
        except TypeError:
            return to(device)
    return data


class ModelHook:
    """Base class of hooks run around a module's forward; override what you need.

    Attributes:
        no_grad: run the wrapped forward under ``torch.no_grad()``.
    """

    no_grad = False

    def init_hook(self, module: nn.Module) -> nn.Module:
        """Called once when the hook is attached. Returns the module (possibly modified)."""
        return module

    def pre_forward(
        self, module: nn.Module, *args: object, **kwargs: object
    ) -> tuple[tuple[object, ...], dict[str, object]]:
        """Called before the forward with its inputs. Returns the (possibly changed) ``(args, kwargs)``."""
        return args, kwargs

    def post_forward(self, module: nn.Module, output: object) -> object:
        """Called after the forward with its output. Returns the (possibly changed) output."""
        return output

    def detach_hook(self, module: nn.Module) -> nn.Module:
        """Called when the hook is removed; undoes what ``init_hook`` did. Returns the module."""
        return module


class SequentialHook(ModelHook):
    """Several hooks run in order: ``pre_forward`` first to last, ``post_forward`` in the same order.

    Args:
        *hooks: the hooks.
    """

    def __init__(self, *hooks: ModelHook) -> None:
        self.hooks = list(hooks)

    @override
    def init_hook(self, module: nn.Module) -> nn.Module:
        for hook in self.hooks:
            module = hook.init_hook(module)
        return module

    @override
    def pre_forward(
        self, module: nn.Module, *args: object, **kwargs: object
    ) -> tuple[tuple[object, ...], dict[str, object]]:
        for hook in self.hooks:
            args, kwargs = hook.pre_forward(module, *args, **kwargs)
        return args, kwargs

    @override
    def post_forward(self, module: nn.Module, output: object) -> object:
        for hook in self.hooks:
            output = hook.post_forward(module, output)
        return output

    @override
    def detach_hook(self, module: nn.Module) -> nn.Module:
        for hook in self.hooks:
            module = hook.detach_hook(module)
        return module


def add_hook_to_module(module: nn.Module, hook: ModelHook, append: bool = False) -> nn.Module:
    """Attach a hook to a module, replacing any hook already there unless ``append``.

    Args:
        module: the module.
        hook: the hook; its ``init_hook`` runs now.
        append: chain after the existing hook (in a :class:`SequentialHook`) instead of replacing it.

    Returns:
        The module (the same object, with its forward wrapped).
    """
    existing = getattr(module, "_hf_hook", None)
    if append and existing is not None:
        old_hooks = existing.hooks if isinstance(existing, SequentialHook) else [existing]
        remove_hook_from_module(module)
        hook = SequentialHook(*old_hooks, hook)
        # The earlier hooks were initialised already; detaching undid that, so initialise them all again.
    elif existing is not None:
        remove_hook_from_module(module)
    instance_forward = module.__dict__.get("forward", _MISSING)
    original = module.forward
    module = hook.init_hook(module)
    # Plain attributes (not parameters or submodules): nn.Module keeps them in the instance __dict__.
    module.__dict__["_hf_hook"] = hook
    module.__dict__["_old_forward"] = original
    module.__dict__["_hf_instance_forward"] = instance_forward

    @functools.wraps(original)
    def new_forward(*args: object, **kwargs: object) -> object:
        current: ModelHook = module.__dict__["_hf_hook"]
        old_forward: Callable[..., object] = module.__dict__["_old_forward"]
        args, kwargs = current.pre_forward(module, *args, **kwargs)
        if current.no_grad:
            with torch.no_grad():
                output = old_forward(*args, **kwargs)
        else:
            output = old_forward(*args, **kwargs)
        return current.post_forward(module, output)

    module.__dict__["forward"] = new_forward
    return module


def remove_hook_from_module(module: nn.Module, recurse: bool = False) -> nn.Module:
    """Remove the hook of a module (calling its ``detach_hook``) and restore the original forward.

    Args:
        module: the module.
        recurse: also remove hooks from all submodules.

    Returns:
        The module.
    """
    hook = module.__dict__.get("_hf_hook")
    if hook is not None:
        hook.detach_hook(module)
        instance_forward = module.__dict__.get("_hf_instance_forward", _MISSING)
        if instance_forward is _MISSING:
            module.__dict__.pop("forward", None)
        else:
            module.__dict__["forward"] = instance_forward
        for name in ("_hf_hook", "_old_forward", "_hf_instance_forward"):
            module.__dict__.pop(name, None)
    if module.__dict__.pop("_dispatch_move_guard", False):
        # dispatch_model blocked .to()/.cuda() while hooks were attached; they work again now.
        for name in _MOVE_METHODS:
            module.__dict__.pop(name, None)
    if recurse:
        for child in module.children():
            remove_hook_from_module(child, recurse=True)
    return module


def remove_hook_from_submodules(module: nn.Module) -> None:
    """Remove the hooks of a module and of all its submodules.

    Args:
        module: the root module.
    """
    remove_hook_from_module(module, recurse=True)


def _first_device(data: object) -> torch.device | None:
    if isinstance(data, torch.Tensor):
        return data.device
    if isinstance(data, Mapping):
        data = list(data.values())
    if isinstance(data, (list, tuple)):
        for item in data:
            found = _first_device(item)
            if found is not None:
                return found
    return None


_prefetch_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _pool() -> ThreadPoolExecutor:
    global _prefetch_pool
    with _pool_lock:
        if _prefetch_pool is None:
            _prefetch_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="accelerando-prefetch")
        return _prefetch_pool


def _touch_pages(tensor: torch.Tensor) -> None:
    # Reading one byte per 4 KiB page makes the OS fault the (memory-mapped) weight in now, in this
    # background thread, instead of during the next module's forward.
    if tensor.device.type == "cpu" and tensor.is_contiguous() and tensor.numel():
        tensor.reshape(-1).view(torch.uint8)[::4096].max()


class AlignDevicesHook(ModelHook):
    """Run a module on one device: move its inputs there, and optionally load offloaded weights.

    With ``offload=False`` the module's tensors are moved to ``execution_device`` once, when attached.
    With ``offload=True`` they are replaced by ``meta`` tensors; each forward loads them from
    ``weights_map`` (a CPU state dict or an :class:`~accelerando.utils.OffloadedWeightsLoader`) onto
    the execution device and drops them afterwards. While a module runs, the hook registered as its
    successor (``dispatch_model`` links them in module order) is loaded in a background thread.

    Args:
        execution_device: where the forward runs.
        offload: offload the module's weights between forwards.
        io_same_device: return outputs on the device the inputs came from.
        weights_map: where offloaded weights are read from (keys relative to the module).
        offload_buffers: offload buffers too (else they are kept on the execution device).
        place_submodules: handle the tensors of all submodules, not only the module's own.
        skip_keys: input/output dict keys left where they are (e.g. a cache).
        tied_params_map: cache shared by all hooks so tied weights are loaded once per device.
    """

    def __init__(
        self,
        execution_device: int | str | torch.device | None = None,
        offload: bool = False,
        io_same_device: bool = False,
        weights_map: Mapping[str, torch.Tensor] | None = None,
        offload_buffers: bool = False,
        place_submodules: bool = False,
        skip_keys: str | list[str] | None = None,
        tied_params_map: dict[int, dict[torch.device, torch.Tensor]] | None = None,
    ) -> None:
        self.execution_device = None if execution_device is None else to_torch_device(execution_device)
        self.offload = offload
        self.io_same_device = io_same_device
        self.weights_map = weights_map
        self.offload_buffers = offload_buffers
        self.place_submodules = place_submodules
        self.skip_keys = skip_keys
        self.tied_params_map = tied_params_map
        self.input_device: torch.device | None = None
        self.offloaded_names: list[str] = []
        self.next_hook: AlignDevicesHook | None = None
        self._prefetched: Future[dict[str, torch.Tensor]] | None = None
        self._tied_added: list[tuple[int, torch.device]] = []

    def __repr__(self) -> str:
        return (
            f"AlignDevicesHook(execution_device={self.execution_device}, offload={self.offload}, "
            f"io_same_device={self.io_same_device}, offload_buffers={self.offload_buffers}, "
            f"place_submodules={self.place_submodules}, skip_keys={self.skip_keys!r})"
        )

    @override
    def init_hook(self, module: nn.Module) -> nn.Module:
        recurse = self.place_submodules
        if not self.offload:
            if self.execution_device is not None:
                for name, _ in named_module_tensors(module, recurse=recurse):
                    set_module_tensor_to_device(
                        module, name, self.execution_device, tied_params_map=self.tied_params_map
                    )
            return module
        tensors = dict(
            named_module_tensors(
                module, include_buffers=self.offload_buffers, recurse=recurse, remove_non_persistent=True
            )
        )
        self.original_devices = {name: tensor.device for name, tensor in tensors.items()}
        if self.weights_map is None:
            self.weights_map = {name: tensor.detach().to("cpu") for name, tensor in tensors.items()}
        self.offloaded_names = [name for name in tensors if name in self.weights_map]
        for name in self.offloaded_names:
            set_module_tensor_to_device(module, name, "meta")
        if self.execution_device is not None:
            # Whatever is not offloaded (buffers, non-persistent buffers) lives on the execution device.
            for name, tensor in named_module_tensors(module, recurse=recurse):
                if name not in self.original_devices or name not in self.weights_map:
                    if tensor.device.type != "meta":
                        set_module_tensor_to_device(module, name, self.execution_device)
        return module

    def _offloaded_weights(self) -> dict[str, torch.Tensor]:
        # init_hook fills weights_map whenever offload is set, before any forward.
        assert self.weights_map is not None
        return {name: self.weights_map[name] for name in self.offloaded_names}

    def _load(self) -> dict[str, torch.Tensor]:
        weights = self._offloaded_weights()
        device = self.execution_device
        for name, value in weights.items():
            if device is not None and device.type != "cpu" and value.device != device:
                weights[name] = value.to(device, non_blocking=True)
            else:
                _touch_pages(value)
        return weights

    def prefetch(self) -> None:
        """Start loading this hook's offloaded weights in the background (used by the previous hook)."""
        if self.offload and self._prefetched is None and self.offloaded_names:
            self._prefetched = _pool().submit(self._load)

    @override
    def pre_forward(
        self, module: nn.Module, *args: object, **kwargs: object
    ) -> tuple[tuple[object, ...], dict[str, object]]:
        if self.io_same_device:
            self.input_device = _first_device([args, kwargs])
        if self.offload:
            pending, self._prefetched = self._prefetched, None
            weights = pending.result() if pending is not None else self._offloaded_weights()
            device = self.execution_device if self.execution_device is not None else torch.device("cpu")
            tied = self.tied_params_map
            for name, value in weights.items():
                if tied is not None and value.data_ptr() in tied and device not in tied[value.data_ptr()]:
                    self._tied_added.append((value.data_ptr(), device))
                set_module_tensor_to_device(module, name, device, value=value, tied_params_map=tied)
            if self.next_hook is not None:
                self.next_hook.prefetch()
        device = self.execution_device
        return send_to_device(args, device, skip_keys=self.skip_keys), send_to_device(
            kwargs, device, skip_keys=self.skip_keys
        )

    @override
    def post_forward(self, module: nn.Module, output: object) -> object:
        if self.offload:
            for name in self.offloaded_names:
                set_module_tensor_to_device(module, name, "meta")
            tied = self.tied_params_map
            if tied is not None:
                for pointer, device in self._tied_added:
                    tied.get(pointer, {}).pop(device, None)
            self._tied_added = []
        if self.io_same_device and self.input_device is not None:
            output = send_to_device(output, self.input_device, skip_keys=self.skip_keys)
        return output

    @override
    def detach_hook(self, module: nn.Module) -> nn.Module:
        if self.offload:
            weights = self._offloaded_weights()
            for name in self.offloaded_names:
                device = self.original_devices.get(name, torch.device("cpu"))
                device = torch.device("cpu") if device.type == "meta" else device
                set_module_tensor_to_device(module, name, device, value=weights[name])
        return module


class CpuOffload(ModelHook):
    """Keep a whole model on CPU and move it to the execution device when it runs.

    The model stays on the execution device after its forward until :meth:`UserCpuOffloadHook.offload`
    is called (or the next model of a chain runs), which suits pipelines calling a model several times.

    Args:
        execution_device: where the model runs (default: the current accelerator, else CPU).
        prev_module_hook: the hook of the previous model in a chain; it is offloaded when this model runs.
    """

    def __init__(
        self,
        execution_device: int | str | torch.device | None = None,
        prev_module_hook: UserCpuOffloadHook | None = None,
    ) -> None:
        self.prev_module_hook = prev_module_hook
        if execution_device is None:
            execution_device = "cuda:0" if torch.cuda.is_available() else "cpu"
        self.execution_device = to_torch_device(execution_device)

    @override
    def init_hook(self, module: nn.Module) -> nn.Module:
        return module.to("cpu")

    @override
    def pre_forward(
        self, module: nn.Module, *args: object, **kwargs: object
    ) -> tuple[tuple[object, ...], dict[str, object]]:
        if self.prev_module_hook is not None:
            self.prev_module_hook.offload()
        module.to(self.execution_device)
        return send_to_device(args, self.execution_device), send_to_device(kwargs, self.execution_device)


class UserCpuOffloadHook:
    """The handle :func:`~accelerando.cpu_offload_with_hook` returns: offload now, or remove the hook.

    Args:
        model: the model the hook is attached to.
        hook: the attached :class:`CpuOffload`.
    """

    def __init__(self, model: nn.Module, hook: CpuOffload) -> None:
        self.model = model
        self.hook = hook

    def offload(self) -> None:
        """Move the model back to CPU."""
        self.hook.init_hook(self.model)

    def remove(self) -> None:
        """Detach the hook; the model stays where it is."""
        remove_hook_from_module(self.model)


class LayerwiseCastingHook(ModelHook):
    """Store a module's weights in a small dtype and cast them up only while it runs.

    Args:
        storage_dtype: dtype between forwards (e.g. ``torch.float8_e4m3fn``).
        compute_dtype: dtype during the forward (e.g. ``torch.bfloat16``).
        non_blocking: passed to the casts.
    """

    def __init__(
        self, storage_dtype: torch.dtype, compute_dtype: torch.dtype, non_blocking: bool = False
    ) -> None:
        self.storage_dtype = storage_dtype
        self.compute_dtype = compute_dtype
        self.non_blocking = non_blocking

    @override
    def init_hook(self, module: nn.Module) -> nn.Module:
        return module.to(dtype=self.storage_dtype, non_blocking=self.non_blocking)

    @override
    def pre_forward(
        self, module: nn.Module, *args: object, **kwargs: object
    ) -> tuple[tuple[object, ...], dict[str, object]]:
        module.to(dtype=self.compute_dtype, non_blocking=self.non_blocking)
        return args, kwargs

    @override
    def post_forward(self, module: nn.Module, output: object) -> object:
        module.to(dtype=self.storage_dtype, non_blocking=self.non_blocking)
        return output


def has_offloaded_params(module: nn.Module) -> bool:
    """Tell whether a module's weights are offloaded (kept on CPU or disk and loaded at each forward).

    Args:
        module: the module.

    Returns:
        True when an offloading :class:`AlignDevicesHook` is attached to it.
    """
    hook = getattr(module, "_hf_hook", None)
    return isinstance(hook, AlignDevicesHook) and hook.offload


@contextlib.contextmanager
def align_module_device(
    module: nn.Module, execution_device: int | str | torch.device | None = None
) -> Iterator[None]:
    """Context manager in which a module's own tensors are materialised on one device.

    For an offloaded module the weights are loaded (to ``execution_device`` if given, else the
    hook's) and offloaded again on exit. For a plain module with ``execution_device`` given, its
    direct parameters are moved there and moved back on exit.

    Args:
        module: the module.
        execution_device: where to materialise the tensors.

    Yields:
        Nothing; read the tensors from ``module`` inside the block.
    """
    hook = getattr(module, "_hf_hook", None)
    if isinstance(hook, AlignDevicesHook) and hook.offload:
        original = hook.execution_device
        if execution_device is not None:
            hook.execution_device = to_torch_device(execution_device)
        try:
            hook.pre_forward(module)
            yield
        finally:
            hook.post_forward(module, None)
            hook.execution_device = original
    elif execution_device is not None:
        saved = {name: param.device for name, param in module.named_parameters(recurse=False)}
        try:
            for name in saved:
                set_module_tensor_to_device(module, name, execution_device)
            yield
        finally:
            for name, device in saved.items():
                set_module_tensor_to_device(module, name, device)
    else:
        yield
