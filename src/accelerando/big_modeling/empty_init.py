"""Build models without allocating their weights: :func:`init_empty_weights` and :func:`init_on_device`.

Models built here live on the ``meta`` device (or the device given) until real weights are loaded,
for example by :func:`accelerando.big_modeling.load_checkpoint_and_dispatch`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
from torch import nn

from accelerando.core.settings import environment_setting

__all__ = ["init_empty_weights", "init_on_device"]


# In-place initialisers: on meta tensors they only validate shapes, yet several of them run through
# slow Python reference implementations (``normal_`` ~1 ms, ``clamp_`` ~2 ms per call). Inside
# ``init_empty_weights`` they return at once for meta tensors, so initialising costs nothing.
_INPLACE_INITIALISERS = (
    "normal_", "uniform_", "erfinv_", "clamp_", "log_normal_", "exponential_", "cauchy_", "geometric_",
    "random_", "bernoulli_",
)  # fmt: skip


@contextlib.contextmanager
def _skip_meta_initialisers() -> Iterator[None]:
    originals = {name: torch.Tensor.__dict__.get(name) for name in _INPLACE_INITIALISERS}

    def skipping(original: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        def method(self: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
            if self.is_meta:
                return self
            return original(self, *args, **kwargs)

        return method

    for name in _INPLACE_INITIALISERS:
        setattr(torch.Tensor, name, skipping(getattr(torch.Tensor, name)))
    try:
        yield
    finally:
        for name, original in originals.items():
            if original is None:
                delattr(torch.Tensor, name)
            else:
                setattr(torch.Tensor, name, original)


@contextlib.contextmanager
def init_on_device(device: torch.device | str, include_buffers: bool | None = None) -> Iterator[None]:
    """Context manager in which new parameters (and optionally buffers) are created on ``device``.

    With ``include_buffers=True`` the block runs under ``with torch.device(device)``: every tensor
    factory without an explicit device allocates on ``device`` (parameters and buffers alike), and
    ``nn.Module.register_parameter`` / ``register_buffer`` are left untouched, so a tensor created with
    an explicit other device stays there. Without it, buffers keep their real values (e.g. rotary
    frequencies computed in ``__init__``) and every parameter is moved to ``device`` when registered.

    Args:
        device: the device for new parameters (``"meta"`` allocates nothing).
        include_buffers: put buffers on ``device`` too; None reads the ``init_include_buffers``
            setting (``ACCELERATE_INIT_INCLUDE_BUFFERS``, default False).

    Yields:
        Nothing; build the model inside the block.

    Example:
        >>> import torch
        >>> from accelerando import init_on_device
        >>> with init_on_device("meta"):  # or "cuda": build straight on the GPU
        ...     layer = torch.nn.Linear(4, 4)
        >>> layer.weight.device
        device(type='meta')
    """
    device = torch.device(device)
    if include_buffers is None:
        include_buffers = environment_setting("init_include_buffers")
    include_buffers = bool(include_buffers)
    original_parameter = nn.Module.register_parameter

    # Named like the method it replaces (``self`` is the module) so it fits nn.Module's signature.
    def register_parameter(self: nn.Module, name: str, param: nn.Parameter | None) -> None:
        original_parameter(self, name, param)
        if param is not None and param.device != device:
            moved = self._parameters[name]
            assert moved is not None  # registered just above (possibly replaced by a registration hook)
            extra = {key: value for key, value in moved.__dict__.items() if not key.startswith("_")}
            kind = type(moved)
            data = moved.data.to(device)
            self._parameters[name] = (
                kind(data, requires_grad=moved.requires_grad, **extra)
                if extra
                else kind(data, moved.requires_grad)
            )

    # Under ``torch.device(device)`` the factories already allocate there; the registration patch is
    # only needed to move parameters while buffers stay where they were created.
    if not include_buffers:
        nn.Module.register_parameter = register_parameter
    skip = _skip_meta_initialisers() if device.type == "meta" else contextlib.nullcontext()
    try:
        with device if include_buffers else contextlib.nullcontext(), skip:
            yield
    finally:
        nn.Module.register_parameter = original_parameter


def init_empty_weights(include_buffers: bool | None = None) -> contextlib.AbstractContextManager[None]:
    """Context manager in which models are built without allocating their weights (``meta`` device).

    Load real weights afterwards with :func:`~accelerando.big_modeling.load_checkpoint_and_dispatch` or
    :func:`~accelerando.utils.load_checkpoint_in_model`.

    Args:
        include_buffers: also create buffers on ``meta``; None reads ``ACCELERATE_INIT_INCLUDE_BUFFERS``
            (default False: buffers keep their values).

    Returns:
        The context manager (see :func:`init_on_device`).

    Example:
        >>> import torch
        >>> from accelerando import init_empty_weights
        >>> with init_empty_weights():
        ...     model = torch.nn.Linear(4096, 4096)  # no memory allocated for the weights
        >>> model.weight.device
        device(type='meta')
    """
    return init_on_device(torch.device("meta"), include_buffers=include_buffers)
