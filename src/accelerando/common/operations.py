"""Operations on nested structures of tensors: moving, converting and communicating them.

Every public function accepts a tensor or any nesting of lists, tuples (named ones too), mappings
(``dict`` and subclasses such as transformers' ``BatchEncoding``) and, for ``send_to_device``,
dataclasses; the result has the same structure and container types.

Communication functions (``gather``, ``gather_object``, ``broadcast``, ``broadcast_object_list``,
``reduce``, ``pad_across_processes``) use ``torch.distributed`` collectives on the default process
group when ``PartialState().use_distributed`` is true, and otherwise behave as the identity (single
process: nothing to exchange). Every process must call them in the same order with structures of the
same layout, as with any collective.
"""

from __future__ import annotations

import dataclasses
import functools
import zlib
from collections.abc import Callable, Iterable, Mapping, MutableMapping, Sequence, Sized
from typing import TYPE_CHECKING, NoReturn, ParamSpec, Protocol, TypeGuard, TypeVar, cast, overload

import torch

from accelerando.core.enums import DistributedType
from accelerando.state import PartialState

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from accelerando.common.nested import Nested, TensorTree

__all__ = [
    "TORCH_DISTRIBUTED_OPERATION_TYPES",
    "CannotPadNestedTensorWarning",
    "ConvertOutputsToFp32",
    "DistributedOperationException",
    "GatheredParameters",
    "TensorInformation",
    "broadcast",
    "broadcast_object_list",
    "concatenate",
    "convert_outputs_to_fp32",
    "convert_to_fp32",
    "chained_operation",
    "copy_tensor_to_devices",
    "find_batch_size",
    "find_device",
    "gather",
    "gather_object",
    "gather_tensor_shape",
    "get_data_structure",
    "get_shape",
    "honor_type",
    "ignorant_find_batch_size",
    "initialize_tensors",
    "is_namedtuple",
    "is_tensor_information",
    "is_torch_tensor",
    "is_torch_xpu_tensor",
    "listify",
    "pad_across_processes",
    "pad_input_tensors",
    "recursively_apply",
    "reduce",
    "send_to_device",
    "slice_tensors",
    "verify_operation",
    "wait_for_everyone",
]

T = TypeVar("T")
_P = ParamSpec("_P")
_R = TypeVar("_R")
_SequenceT = TypeVar("_SequenceT", bound=Sequence[object])
_K = TypeVar("_K")
_O = TypeVar("_O")


class _Movable(Protocol):
    """An object ``send_to_device`` moves: a tensor, or anything else with a ``.to(device)`` method."""

    def to(self, device: torch.device | str | int, /, *, non_blocking: bool = ...) -> object: ...


@dataclasses.dataclass(frozen=True)
class TensorInformation:
    """Shape and dtype of a tensor, standing in for it where only the layout travels.

    Attributes:
        shape: the tensor's shape.
        dtype: the tensor's dtype.
    """

    shape: torch.Size
    dtype: torch.dtype


def is_torch_tensor(tensor: object) -> bool:
    """Tell whether ``tensor`` is a ``torch.Tensor``.

    Args:
        tensor: anything.

    Returns:
        True for tensors (parameters included).
    """
    return isinstance(tensor, torch.Tensor)


def is_torch_xpu_tensor(tensor: object) -> bool:
    """Tell whether ``tensor`` is a ``torch.Tensor`` stored on an Intel XPU device.

    Args:
        tensor: anything.

    Returns:
        True for tensors whose device type is ``"xpu"``.
    """
    return isinstance(tensor, torch.Tensor) and tensor.device.type == "xpu"


def is_tensor_information(tensor_info: object) -> bool:
    """Tell whether ``tensor_info`` is a :class:`TensorInformation`.

    Args:
        tensor_info: anything.

    Returns:
        True for ``TensorInformation`` instances.
    """
    return isinstance(tensor_info, TensorInformation)


def is_namedtuple(data: object) -> bool:
    """Tell whether ``data`` is an instance of a ``collections.namedtuple`` / ``typing.NamedTuple``.

    Args:
        data: anything.

    Returns:
        True for named tuples.
    """
    return isinstance(data, tuple) and hasattr(data, "_fields") and hasattr(type(data), "_make")


def _constructor(obj: _O) -> Callable[..., _O]:
    """``type(obj)`` as a callable: a container's constructor is not part of its abstract interface."""
    return type(obj)


def honor_type(obj: _SequenceT, generator: Iterable[object]) -> _SequenceT:
    """Build a sequence of the same type as ``obj`` from the items of ``generator``.

    Named tuples take their items as positional arguments; other sequence types take one iterable.

    Args:
        obj: the sequence whose type to reproduce.
        generator: an iterable of the new items.

    Returns:
        A new sequence of ``type(obj)``.
    """
    build = _constructor(obj)
    if is_namedtuple(obj):
        return build(*list(generator))
    return build(generator)


def _rebuild_mapping(data: Mapping[_K, object], items: dict[_K, object]) -> Mapping[_K, object]:
    build = _constructor(data)
    try:
        return build(items)
    except TypeError:
        # Some Mapping subclasses take keyword arguments or extra constructor arguments; a shallow
        # copy keeps their other attributes, then the values are replaced.
        if isinstance(data, MutableMapping):
            import copy

            new = copy.copy(data)
            for key, value in items.items():
                new[key] = value
            return new
        return items


def recursively_apply(
    func: Callable[..., object],
    data: object,
    *args: object,
    test_type: Callable[[object], bool] = is_torch_tensor,
    error_on_other_type: bool = False,
    **kwargs: object,
) -> object:
    """Apply ``func`` to every leaf of a nested structure that passes ``test_type``.

    Lists, tuples (named ones too) and mappings are walked and rebuilt with their own type; leaves
    that fail ``test_type`` are returned unchanged (or rejected, see ``error_on_other_type``).

    Args:
        func: called as ``func(leaf, *args, **kwargs)`` on every matching leaf.
        data: a leaf or a nesting of lists, tuples and mappings.
        *args: extra positional arguments for ``func``.
        test_type: decides which leaves ``func`` applies to (default: tensors).
        error_on_other_type: raise on a leaf that is neither a container nor matching.
        **kwargs: extra keyword arguments for ``func``.

    Returns:
        The same structure with ``func`` applied to the matching leaves.

    Raises:
        TypeError: if ``error_on_other_type`` and a leaf does not pass ``test_type``.
    """

    def walk(item: object) -> object:
        if isinstance(item, (tuple, list)):
            return honor_type(item, (walk(o) for o in item))
        if isinstance(item, Mapping):
            return _rebuild_mapping(item, {k: walk(v) for k, v in item.items()})
        if test_type(item):
            return func(item, *args, **kwargs)
        if error_on_other_type:
            # The reference's wording, which callers match on.
            raise TypeError(
                f"Unsupported types ({type(item)}) passed to `{getattr(func, '__name__', func)}`. Only nested "
                f"list/tuple/dicts of objects that are valid for `{getattr(test_type, '__name__', test_type)}` "
                "should be passed."
            )
        return item

    return walk(data)


def _has_to(item: object) -> TypeGuard[_Movable]:
    return callable(getattr(item, "to", None)) and not isinstance(item, type)


def _move(obj: _Movable, device: torch.device | str | int, non_blocking: bool) -> object:
    if isinstance(device, str) and device == "npu":
        # torch_npu cannot find the current device context for a bare "npu" on first use.
        device = "npu:0"
    try:
        return obj.to(device, non_blocking=non_blocking)
    except TypeError:
        # Objects whose .to() does not take non_blocking (e.g. some tokenizer outputs).
        return obj.to(device)


def send_to_device(
    tensor: T,
    device: torch.device | str | int,
    non_blocking: bool = False,
    skip_keys: list[str] | str | None = None,
) -> T:
    """Move every tensor (or object with a ``.to`` method) of a nested structure to ``device``.

    Args:
        tensor: a tensor or a nesting of lists, tuples, named tuples, mappings and dataclasses.
            Leaves without ``.to`` (numbers, strings, ...) are left as they are.
        device: the target device.
        non_blocking: ask for an asynchronous copy (pinned CPU memory to GPU).
        skip_keys: mapping keys (one or a list) whose values are not moved, at any depth.

    Returns:
        The same structure, with its tensors on ``device``.

    Example:
        >>> import torch
        >>> from accelerando.utils import send_to_device
        >>> batch = {"input_ids": torch.ones(2, 3, dtype=torch.long), "labels": [0, 1]}
        >>> batch = send_to_device(batch, "cpu")  # e.g. "cuda:0"; values without .to() stay as they are
        >>> batch["input_ids"].device, batch["labels"]
        (device(type='cpu'), [0, 1])
    """
    if isinstance(skip_keys, str):
        skip_keys = [skip_keys]
    skip = frozenset(skip_keys or ())

    def walk(item: object) -> object:
        if isinstance(item, torch.Tensor):
            return _move(item, device, non_blocking)
        if isinstance(item, Mapping) and (skip or not hasattr(item, "to")):
            return _rebuild_mapping(item, {k: v if k in skip else walk(v) for k, v in item.items()})
        if _has_to(item):
            return _move(item, device, non_blocking)
        if isinstance(item, (tuple, list)):
            return honor_type(item, (walk(o) for o in item))
        if dataclasses.is_dataclass(item) and not isinstance(item, type):
            changes = {f.name: walk(getattr(item, f.name)) for f in dataclasses.fields(item) if f.init}
            return dataclasses.replace(item, **changes)
        return item

    # Every container is rebuilt with its own type and tensors stay tensors: the result has the
    # input's type, which the checker cannot follow through the recursion.
    return cast("T", walk(tensor))


def _convert_to_list(tensor: torch.Tensor) -> object:
    tensor = tensor.detach().cpu()
    if tensor.dtype == torch.bfloat16:
        # numpy-backed tolist() has no bfloat16.
        tensor = tensor.float()
    return tensor.tolist()


def listify(data: TensorTree) -> object:
    """Turn every tensor of a nested structure into nested Python lists (or a number for 0-d).

    Args:
        data: a tensor or a nesting of lists, tuples and mappings of tensors.

    Returns:
        The same structure with plain Python values in place of tensors.
    """
    return recursively_apply(_convert_to_list, data)


def _is_half(tensor: object) -> bool:
    return isinstance(tensor, torch.Tensor) and tensor.dtype in (torch.float16, torch.bfloat16)


def convert_to_fp32(tensor: T) -> T:
    """Convert every float16 / bfloat16 tensor of a nested structure to float32.

    Args:
        tensor: a tensor or a nesting of lists, tuples and mappings; other leaves pass unchanged.

    Returns:
        The same structure with half-precision tensors upcast.
    """
    return _map_tensors(lambda t: t.float(), tensor, test_type=_is_half)


def convert_outputs_to_fp32(model_forward: Callable[_P, _R]) -> Callable[_P, _R]:
    """Wrap a forward function so that its half-precision outputs come back as float32.

    The wrapper keeps the wrapped function in ``__wrapped__`` so it can be removed again.

    Args:
        model_forward: the forward function (usually a bound ``model.forward``).

    Returns:
        The wrapping function.
    """

    @functools.wraps(model_forward)
    def forward(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        return convert_to_fp32(model_forward(*args, **kwargs))

    return forward


def _map_tensors(
    func: Callable[..., torch.Tensor],
    data: T,
    *args: object,
    test_type: Callable[[object], bool] = is_torch_tensor,
    error_on_other_type: bool = False,
    **kwargs: object,
) -> T:
    """``recursively_apply`` for a ``func`` that maps tensors to tensors: the result has ``data``'s type."""
    result = recursively_apply(
        func, data, *args, test_type=test_type, error_on_other_type=error_on_other_type, **kwargs
    )
    # Containers are rebuilt with their own types and tensors replaced by tensors, so the structure's
    # type is kept; the checker cannot follow that through the recursion.
    return cast("T", result)


def _tensor_leaves(data: object, strict: bool = False) -> list[torch.Tensor]:
    # With strict, a non-tensor leaf raises here, before any process enters a collective.
    leaves: list[torch.Tensor] = []
    recursively_apply(leaves.append, data, error_on_other_type=strict)
    return leaves


def find_batch_size(data: object) -> int:
    """Return the size of the first dimension of the first batched tensor in a nested structure.

    Args:
        data: a tensor or a nesting of lists, tuples and mappings holding tensors.

    Returns:
        The batch size.

    Raises:
        ValueError: if the structure is empty or holds only 0-d tensors.
        TypeError: if it holds no tensor at all.
    """
    if isinstance(data, (list, tuple, Mapping)) and len(data) == 0:
        raise ValueError(
            "Cannot find the batch size of an empty structure; pass a batch holding at least a tensor."
        )
    leaves = _tensor_leaves(data)
    if not leaves:
        raise TypeError(f"Can only find the batch size of tensors, but {type(data).__name__} holds none.")
    for leaf in leaves:
        if leaf.ndim > 0:
            return leaf.shape[0]
    raise ValueError("Cannot find the batch size: every tensor in the batch is 0-dimensional.")


def slice_tensors(
    data: T,
    tensor_slice: slice | int | torch.Tensor | Sequence[int] | tuple[slice | int | None, ...],
    process_index: int | None = None,
    num_processes: int | None = None,
) -> T:
    """Index every tensor of a nested structure with ``tensor_slice`` (along the first dimension).

    Args:
        data: a tensor or a nesting of lists, tuples and mappings of tensors.
        tensor_slice: what to index with, e.g. ``slice(0, 8)``.
        process_index: accepted for API compatibility; unused.
        num_processes: accepted for API compatibility; unused.

    Returns:
        The same structure with each tensor replaced by ``tensor[tensor_slice]``.
    """
    return _map_tensors(lambda t: t[tensor_slice], data)


def concatenate(data: Sequence[T], dim: int = 0) -> T:
    """Concatenate a list of structures of the same layout leaf by leaf.

    Args:
        data: a non-empty list of tensors, or of nested lists/tuples/mappings with the same layout.
        dim: the dimension to concatenate along.

    Returns:
        One structure of that layout whose tensors are the concatenations.

    Raises:
        ValueError: if ``data`` is empty.
        TypeError: if a leaf is not a tensor (with two or more structures; one is returned as is).
    """
    if len(data) == 0:
        raise ValueError("concatenate needs at least one structure; got an empty list.")
    first = data[0]
    if len(data) == 1:
        # One batch has nothing to merge: it is returned as it is, whatever its leaves.
        return first
    # Every structure has the first one's layout (the documented contract), so each is read as a
    # container of the same kind as the first.
    if isinstance(first, (tuple, list)):
        rows = cast("Sequence[Sequence[object]]", data)
        return honor_type(first, (concatenate([d[i] for d in rows], dim=dim) for i in range(len(first))))
    if isinstance(first, Mapping):
        maps = cast("Sequence[Mapping[object, object]]", data)
        return cast(
            "T", _rebuild_mapping(first, {k: concatenate([d[k] for d in maps], dim=dim) for k in first})
        )
    if not isinstance(first, torch.Tensor):
        raise TypeError(f"Can only concatenate tensors, but got {type(first).__name__}.")
    return cast("T", torch.cat(cast("list[torch.Tensor]", list(data)), dim=dim))


def get_data_structure(data: TensorTree) -> Nested[TensorInformation]:
    """Replace every tensor of a nested structure by its :class:`TensorInformation` (shape and dtype).

    The result describes the layout without the data, so it can travel between processes cheaply
    and :func:`initialize_tensors` can rebuild empty tensors from it.

    Args:
        data: a tensor or a nesting of lists, tuples and mappings of tensors.

    Returns:
        The same structure with ``TensorInformation`` in place of tensors.
    """
    return cast(
        "Nested[TensorInformation]",
        recursively_apply(lambda t: TensorInformation(shape=t.shape, dtype=t.dtype), data),
    )


def get_shape(data: object) -> object:
    """Replace every tensor of a nested structure by its shape, as a list of ints.

    Args:
        data: a tensor or a nesting of lists, tuples and mappings of tensors.

    Returns:
        The same structure with ``list(tensor.shape)`` in place of tensors.
    """
    return recursively_apply(lambda t: list(t.shape), data)


def initialize_tensors(data_structure: Nested[TensorInformation]) -> TensorTree:
    """Build uninitialised CPU tensors from a structure made by :func:`get_data_structure`.

    Args:
        data_structure: a nesting of lists, tuples and mappings of :class:`TensorInformation`.

    Returns:
        The same structure with ``torch.empty(shape, dtype=dtype)`` in place of each description.
    """
    return cast(
        "TensorTree",
        recursively_apply(
            lambda info: torch.empty(info.shape, dtype=info.dtype),
            data_structure,
            test_type=is_tensor_information,
        ),
    )


def find_device(data: object) -> torch.device | None:
    """Return the device of the first tensor found in a nested structure (depth first, in order).

    Args:
        data: a tensor or a nesting of lists, tuples and mappings.

    Returns:
        That tensor's device, or None when the structure holds no tensor.
    """
    stack: list[object] = [data]
    while stack:
        item = stack.pop()
        if isinstance(item, torch.Tensor):
            return item.device
        if isinstance(item, Mapping):
            stack.extend(reversed(list(item.values())))
        elif isinstance(item, (list, tuple)):
            stack.extend(reversed(item))
    return None


def ignorant_find_batch_size(data: object) -> int | None:
    """Like :func:`find_batch_size`, but None instead of an error when no batch size can be found.

    Args:
        data: anything.

    Returns:
        The batch size, or None (no tensor, empty structure, only 0-d tensors).
    """
    try:
        return find_batch_size(data)
    except (ValueError, TypeError):
        return None


def pad_input_tensors(tensor: T, batch_size: int, num_processes: int, dim: int = 0) -> T:
    """Pad every tensor of a batch with zeros along ``dim`` so the batch splits evenly over processes.

    The size along ``dim`` grows to the next multiple of ``num_processes`` (and to at least
    ``num_processes``, so every process gets one sample); the original samples come first. Tensors
    already of that size are returned unchanged.

    Args:
        tensor: a tensor or a nesting of lists, tuples and mappings of tensors.
        batch_size: the batch size (the size of the tensors along ``dim``).
        num_processes: how many processes will share the batch.
        dim: the batch dimension.

    Returns:
        The same structure with padded tensors.

    Raises:
        ValueError: ``num_processes`` is below 1.
        TypeError: a leaf is not a tensor.
    """
    if num_processes < 1:
        raise ValueError(f"num_processes must be at least 1, got {num_processes}.")
    target = max(num_processes, -(-batch_size // num_processes) * num_processes)

    def pad(t: torch.Tensor) -> torch.Tensor:
        axis = dim % t.ndim
        if t.shape[axis] >= target:
            return t
        shape = list(t.shape)
        shape[axis] = target
        padded = t.new_zeros(shape)
        index = [slice(None)] * t.ndim
        index[axis] = slice(0, t.shape[axis])
        padded[tuple(index)] = t
        return padded

    return _map_tensors(pad, tensor, error_on_other_type=True)


class CannotPadNestedTensorWarning(UserWarning):
    """Warned when padding is asked for a nested (jagged) tensor, which cannot be padded; it is left as is."""


class ConvertOutputsToFp32:
    """A forward function whose float16 / bfloat16 outputs come back as float32.

    The object form of :func:`convert_outputs_to_fp32`. Pickling it is refused: it wraps a bound
    forward whose model should be unwrapped (``Accelerator.unwrap_model``) before saving.

    Args:
        model_forward: the forward function to wrap.
    """

    def __init__(self, model_forward: Callable[..., object]) -> None:
        self.model_forward = model_forward
        functools.update_wrapper(self, model_forward)

    def __call__(self, *args: object, **kwargs: object) -> object:
        """Run the forward and upcast its half-precision outputs."""
        return convert_to_fp32(self.model_forward(*args, **kwargs))

    def __getstate__(self) -> NoReturn:
        import pickle

        raise pickle.PicklingError(
            "Cannot pickle a model whose forward converts outputs to fp32 (prepared with mixed precision); "
            "unwrap it first with Accelerator.unwrap_model(model)."
        )


# --- communication ---------------------------------------------------------------------------------


def _state() -> PartialState:

    return PartialState()


def _distributed() -> PartialState | None:
    state = _state()
    return state if state.use_distributed else None


def wait_for_everyone() -> None:
    """Block until every process reaches this point (a barrier); returns at once in a single process."""
    _state().wait_for_everyone()


def _signature(tensors: list[torch.Tensor]) -> list[int]:
    text = ";".join(f"{tuple(t.shape)}:{t.dtype}" for t in tensors)
    return [len(tensors), zlib.crc32(text.encode())]


def _check_same_layout(tensors: list[torch.Tensor], device: torch.device, what: str) -> None:
    """Fail clearly (instead of hanging or mixing data) when processes hold different shapes."""
    import torch.distributed as dist

    mine = torch.tensor(_signature(tensors), dtype=torch.int64, device=device)
    everyone = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, mine)
    if all(torch.equal(other, mine) for other in everyone):
        return
    layouts: list[object] = [None] * dist.get_world_size()
    dist.all_gather_object(layouts, [(tuple(t.shape), str(t.dtype)) for t in tensors])
    detail = "; ".join(f"process {rank}: {layout}" for rank, layout in enumerate(layouts))
    raise ValueError(
        f"Cannot {what}: the processes hold tensors of different shapes or dtypes ({detail}). "
        "Call pad_across_processes(tensor, dim=...) first so every process has the same shape, "
        "or use gather_object for data of varying shapes."
    )


def _comm_device(tensors: list[torch.Tensor], state: PartialState) -> torch.device:
    return tensors[0].device if tensors else torch.device(state.device)


def _all_gather_tensor(tensor: torch.Tensor) -> torch.Tensor:
    import torch.distributed as dist

    if tensor.ndim == 0:
        tensor = tensor.reshape(1)
    tensor = tensor.contiguous()
    world = dist.get_world_size()
    if dist.get_backend() == "gloo":
        # gloo has no all_gather_into_tensor; gather into a list and concatenate instead.
        parts = [torch.empty_like(tensor) for _ in range(world)]
        dist.all_gather(parts, tensor)
        return torch.cat(parts, dim=0)
    output = torch.empty(
        (world * tensor.shape[0], *tensor.shape[1:]), dtype=tensor.dtype, device=tensor.device
    )
    dist.all_gather_into_tensor(output, tensor)
    return output


def gather(tensor: T) -> T:
    """Gather tensors from all processes and concatenate them along the first dimension.

    0-d tensors are gathered as one element each (the result has one entry per process);
    non-contiguous tensors are made contiguous first.

    Args:
        tensor: a tensor or a nesting of lists, tuples and mappings of tensors; every process must
            pass the same layout with the same shapes.

    Returns:
        The same structure with each tensor replaced by the concatenation of every process's tensor
        (in rank order). In a single process, ``tensor`` itself.

    Raises:
        ValueError: if processes hold different shapes or dtypes (pad with ``pad_across_processes``).
        TypeError: if a leaf is not a tensor.
    """
    state = _distributed()
    if state is None:
        return tensor
    leaves = _tensor_leaves(tensor, strict=True)
    _check_same_layout(leaves, _comm_device(leaves, state), "gather")
    return _map_tensors(_all_gather_tensor, tensor, error_on_other_type=True)


@overload
def gather_object(object: list[T]) -> list[T]: ...


@overload
def gather_object(object: tuple[T, ...]) -> Sequence[T]: ...


@overload
def gather_object(object: object) -> object: ...


def _contribution(item: object) -> list[object]:
    """What one process adds to ``gather_object``'s result: the items iterating it gives (a list's
    items, a tensor's rows, a dict's keys, a string's characters, as the reference flattens), or the
    object itself when it cannot be iterated (a number, None, a 0-d tensor; the reference fails there).
    """
    if isinstance(item, torch.Tensor) and item.ndim == 0:
        return [item]
    try:
        return list(item)  # type: ignore[call-overload]
    except TypeError:
        return [item]


def gather_object(object: object) -> object:
    """Gather picklable objects from all processes, as the reference does.

    In a single process ``object`` comes back itself. With several processes, each process's
    object is iterated and the items of every process are concatenated in rank order: pass a list
    (``gather_object([x])``) to get one entry per process. What iteration gives is what comes back:
    a tensor contributes its rows, a dict its keys, a string its characters (the reference's
    behaviour). An object that cannot be iterated (a number, None, a 0-d tensor), which the
    reference rejects, contributes itself.

    Args:
        object: any picklable object, usually a list.

    Returns:
        ``object`` itself in a single process; otherwise the list of every process's items.
    """
    state = _distributed()
    if state is None:
        return object
    import torch.distributed as dist

    gathered: list[object] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, object)
    return [item for contribution in gathered for item in _contribution(contribution)]


def _check_source(from_process: int, state: PartialState) -> None:
    if not 0 <= from_process < state.num_processes:
        raise ValueError(
            f"from_process={from_process} is not a process of this run; use a rank in [0, {state.num_processes - 1}]."
        )


def broadcast(tensor: T, from_process: int = 0) -> T:
    """Copy the tensors of process ``from_process`` into the same-shaped tensors of every process.

    The tensors are overwritten in place (and returned for convenience).

    Args:
        tensor: a tensor or a nesting of lists, tuples and mappings of tensors, with the same layout
            and shapes on every process.
        from_process: the rank whose values are sent.

    Returns:
        ``tensor``, now holding the values of ``from_process``.

    Raises:
        ValueError: if ``from_process`` is not a valid rank or the shapes differ between processes.
        TypeError: if a leaf is not a tensor.
    """
    state = _distributed()
    if state is None:
        return tensor
    _check_source(from_process, state)
    import torch.distributed as dist

    leaves = _tensor_leaves(tensor, strict=True)
    _check_same_layout(leaves, _comm_device(leaves, state), "broadcast")

    def one(t: torch.Tensor) -> torch.Tensor:
        buffer = t.contiguous()
        dist.broadcast(buffer, src=from_process)
        if buffer is not t:
            t.copy_(buffer)
        return t

    return _map_tensors(one, tensor, error_on_other_type=True)


def broadcast_object_list(object_list: list[T], from_process: int = 0) -> list[T]:
    """Replace, in place, the items of ``object_list`` on every process by those of ``from_process``.

    As in the reference, ``object_list`` goes to ``torch.distributed.broadcast_object_list`` as it
    is (anything indexable whose items can be assigned; a list in practice), and comes back
    untouched in a single process. An empty one returns at once (torch would wait forever).

    Args:
        object_list: a list of picklable objects, of the same length on every process.
        from_process: the rank whose objects are sent.

    Returns:
        ``object_list``, updated in place.

    Raises:
        ValueError: if ``from_process`` is not a valid rank.
    """
    state = _distributed()
    if state is None:
        return object_list
    _check_source(from_process, state)
    if isinstance(object_list, Sized) and not isinstance(object_list, torch.Tensor) and not len(object_list):
        return object_list  # nothing to send
    import torch.distributed as dist

    dist.broadcast_object_list(object_list, src=from_process)
    return object_list


_REDUCTIONS = ("mean", "sum", "none", None)


def reduce(tensor: T, reduction: str | None = "mean", scale: float = 1.0) -> T:
    """Reduce every tensor of a nested structure across processes, as the reference does.

    The input is not modified: a reduced copy is returned. ``"sum"`` adds the processes' tensors;
    ``"mean"`` divides that sum by the number of processes; ``"none"`` / ``None`` sums without
    dividing. In a single process the copies come back as they are (an integer tensor stays
    integer). With several processes an integer mean becomes floating point (the reference fails
    there, dividing in place).

    Args:
        tensor: a tensor or a nesting of lists, tuples and mappings of same-shaped tensors.
        reduction: ``"mean"``, ``"sum"`` or ``"none"``.
        scale: accepted for the reference's signature, where it acts only on XLA (TPU) devices; it
            has no effect on the devices accelerando drives, as on the reference's.

    Returns:
        The reduced copies (in a single process: copies of the inputs).

    Raises:
        ValueError: if ``reduction`` is not one of the accepted values, or shapes differ.
        TypeError: if a leaf is not a tensor.
    """
    del scale  # the reference applies it on XLA only
    if reduction not in _REDUCTIONS:
        raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}.")
    state = _distributed()
    if state is None:
        return _map_tensors(torch.clone, tensor, error_on_other_type=True)
    leaves = _tensor_leaves(tensor, strict=True)
    _check_same_layout(leaves, _comm_device(leaves, state), "reduce")
    num_processes = state.num_processes

    def one(t: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist

        result = t.clone().contiguous()
        dist.all_reduce(result, op=dist.ReduceOp.SUM)
        return result / num_processes if reduction == "mean" else result

    return _map_tensors(one, tensor, error_on_other_type=True)


def _same(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


def _warn_if_nested(tensor: torch.Tensor) -> bool:
    """Warn (CannotPadNestedTensorWarning) and return True when ``tensor`` is nested (jagged)."""
    if not tensor.is_nested:
        return False
    import warnings

    warnings.warn(
        "pad_across_processes cannot pad a nested (jagged) tensor: its sizes differ per component. "
        "It is returned unpadded; pad its components (or convert with to_padded_tensor) first.",
        CannotPadNestedTensorWarning,
        stacklevel=5,
    )
    return True


def _pad_one(tensor: torch.Tensor, dim: int, pad_index: int, pad_first: bool) -> torch.Tensor:
    if _warn_if_nested(tensor):
        return tensor
    if tensor.ndim == 0 or not -tensor.ndim <= dim < tensor.ndim:
        return tensor
    dim = dim % tensor.ndim
    size = torch.tensor([tensor.shape[dim]], dtype=torch.int64, device=tensor.device)
    # Sizes along `dim` are the only thing exchanged: a fixed-shape tensor, so no layout check needed.
    max_size = int(_all_gather_tensor(size).max().item())
    if max_size == tensor.shape[dim]:
        return tensor
    new_shape = list(tensor.shape)
    new_shape[dim] = max_size
    padded = tensor.new_full(new_shape, pad_index)
    start = max_size - tensor.shape[dim] if pad_first else 0
    index = [slice(None)] * tensor.ndim
    index[dim] = slice(start, start + tensor.shape[dim])
    padded[tuple(index)] = tensor
    return padded


def pad_across_processes(tensor: T, dim: int = 0, pad_index: int = 0, pad_first: bool = False) -> T:
    """Pad tensors along ``dim`` to the largest size any process holds, so they can be gathered.

    Tensors with fewer than ``dim + 1`` dimensions are returned unchanged.

    Args:
        tensor: a tensor or a nesting of lists, tuples and mappings of tensors (same layout and
            number of dimensions on every process).
        dim: the dimension to pad.
        pad_index: the value to pad with.
        pad_first: pad at the start of the dimension instead of the end.

    Returns:
        The same structure with padded tensors (in a single process, the same tensors; their
        containers rebuilt, as the reference does).

    Raises:
        TypeError: if a leaf is not a tensor.
    """
    if _distributed() is None:
        # Nothing to pad against; a nested tensor still gets its warning, as it would with peers.
        recursively_apply(_warn_if_nested, tensor)
        # As the reference: containers come back rebuilt, a leaf that is not a tensor is refused.
        return _map_tensors(_same, tensor, error_on_other_type=True)
    # Called directly (not through _map_tensors): the nested-tensor warning's stacklevel counts these
    # frames. Tensors are replaced by tensors, so the structure keeps its type.
    padded = recursively_apply(
        _pad_one, tensor, dim=dim, pad_index=pad_index, pad_first=pad_first, error_on_other_type=True
    )
    return cast("T", padded)


# --- checks around collectives ---------------------------------------------------------------------

# Distributed types whose collectives go through torch.distributed (the reference's list, in its
# order); names without a member in this version's enum stay plain strings, which compare equal to
# the string-valued members.
TORCH_DISTRIBUTED_OPERATION_TYPES: list[DistributedType | str] = []


def _distributed_operation_types() -> list[DistributedType | str]:
    names = ["DEEPSPEED", "MULTI_GPU", "FSDP", "MEGATRON_LM", "TP", "MULTI_NPU", "MULTI_MLU", "MULTI_SDAA",
             "MULTI_MUSA", "MULTI_XPU", "MULTI_CPU", "MULTI_HPU", "MULTI_NEURON"]  # fmt: skip
    return [getattr(DistributedType, name, name) for name in names]


TORCH_DISTRIBUTED_OPERATION_TYPES.extend(_distributed_operation_types())


class DistributedOperationException(Exception):
    """Raised when the processes call a collective with data that do not match (e.g. different shapes)."""


def _first_argument(args: tuple[object, ...], kwargs: Mapping[str, object]) -> object:
    return kwargs["tensor"] if "tensor" in kwargs else (args[0] if args else None)


def verify_operation(function: Callable[_P, _R]) -> Callable[_P, _R]:
    """Decorate a collective so that, in debug mode, mismatched shapes fail before it runs.

    With several processes and debug mode on (``ACCELERATE_DEBUG_MODE=1`` or the ``debug`` setting),
    every process first shares the shapes of the operation's ``tensor`` argument; if they differ,
    :class:`DistributedOperationException` names each process's shapes instead of letting the
    collective hang or mix data. Otherwise the function runs unchecked.

    Args:
        function: a collective taking the data as ``tensor`` (first positional argument).

    Returns:
        The checking wrapper.
    """

    @functools.wraps(function)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        state = _state()
        if not state.use_distributed or not state.debug:
            return function(*args, **kwargs)
        shapes = get_shape(_first_argument(args, kwargs))
        everyone = gather_object([shapes])
        if any(other != everyone[0] for other in everyone):
            detail = "\n  ".join(f"process {rank}: {shape}" for rank, shape in enumerate(everyone))
            raise DistributedOperationException(
                f"Cannot apply {function.__module__}.{function.__name__}: the processes hold tensors of "
                f"different shapes:\n  {detail}\nPad them first (pad_across_processes) or gather objects instead."
            )
        return function(*args, **kwargs)

    return wrapper


def chained_operation(function: Callable[_P, _R]) -> Callable[_P, _R]:
    """Decorate an operation built on other collectives so their mismatch errors name it too.

    A :class:`DistributedOperationException` raised inside is raised again, chained, naming
    ``function``; other errors pass through unchanged.

    Args:
        function: the composite operation.

    Returns:
        The wrapper.
    """

    @functools.wraps(function)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return function(*args, **kwargs)
        except DistributedOperationException as error:
            raise DistributedOperationException(
                f"{function.__module__}.{function.__name__} failed in a collective it calls; see the error above."
            ) from error

    return wrapper


# --- moving one process's tensor to every process --------------------------------------------------

_DTYPE_CODES: tuple[torch.dtype, ...] = (
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.uint8, torch.int8,
    torch.int16, torch.int32, torch.int64, torch.bool,
)  # fmt: skip


def gather_tensor_shape(tensor: torch.Tensor | None) -> tuple[torch.Tensor, int]:
    """Tell every process the shape and dtype of a tensor that only some (usually one) process holds.

    Every process must call it; those without the tensor pass None.

    Args:
        tensor: the tensor on the process(es) holding it, None on the others.

    Returns:
        ``(shape, dtype_code)``: the shape as a 1-d int64 tensor on this process's device and the
        dtype's code (its position in the supported dtypes: float32, float64, float16, bfloat16,
        uint8, int8, int16, int32, int64, bool).

    Raises:
        ValueError: no process holds a tensor, or the dtype is not one of the supported ones.
    """
    if tensor is not None and tensor.dtype not in _DTYPE_CODES:
        raise ValueError(f"gather_tensor_shape supports {list(_DTYPE_CODES)}, not {tensor.dtype}.")
    mine = None if tensor is None else (list(tensor.shape), _DTYPE_CODES.index(tensor.dtype))
    found = next((entry for entry in gather_object([mine]) if entry is not None), None)
    if found is None:
        raise ValueError(
            "No process passed a tensor: the process holding the data must pass it (others pass None)."
        )
    shape, code = found
    return torch.tensor(shape, dtype=torch.int64, device=_state().device), code


def copy_tensor_to_devices(tensor: torch.Tensor | None = None) -> torch.Tensor:
    """Give every process a copy, on its own device, of a tensor that one process holds.

    Unlike :func:`broadcast`, the other processes need not know the shape: they pass None. Every
    process must call it.

    Args:
        tensor: the tensor on the process holding it, None on the others.

    Returns:
        The tensor, on this process's device (in a single process: ``tensor`` itself).

    Raises:
        ValueError: no process (or, in a single process, this one) passed a tensor.
    """
    state = _distributed()
    if state is None:
        if tensor is None:
            raise ValueError(
                "copy_tensor_to_devices needs the tensor on the process that holds it; got None."
            )
        return tensor
    import torch.distributed as dist

    holders = gather_object([dist.get_rank() if tensor is not None else None])
    source = next((rank for rank in holders if rank is not None), None)
    if source is None:
        raise ValueError(
            "No process passed a tensor: the process holding the data must pass it (others pass None)."
        )
    shape, code = gather_tensor_shape(tensor)
    if dist.get_rank() == source:
        assert tensor is not None  # the source is, by construction, a process that passed a tensor
        buffer = tensor.contiguous()
    else:
        buffer = torch.empty(shape.tolist(), dtype=_DTYPE_CODES[code], device=torch.device(state.device))
    dist.broadcast(buffer, src=source)
    return buffer


# --- gathering sharded parameters ------------------------------------------------------------------


def _is_zero3_param(param: object) -> bool:
    # DeepSpeed ZeRO-3 marks the parameters it partitions with a ds_id.
    return hasattr(param, "ds_id")


def GatheredParameters(  # noqa: N802 - the reference's name for a context-manager factory
    params: torch.Tensor | Iterable[torch.Tensor] | None,
    modifier_rank: int | None = None,
    fwd_module: torch.nn.Module | None = None,
    enabled: bool = True,
) -> AbstractContextManager[object]:
    """Context manager in which parameters sharded by DeepSpeed ZeRO-3 are whole on every process.

    For ZeRO-3 parameters this is ``deepspeed.zero.GatheredParameters``: inside the block each
    parameter holds its full value; with ``modifier_rank``, changes that process makes are
    partitioned back on exit. Parameters that are not sharded (single process, DDP, ZeRO 0-2) are
    already whole, so the context does nothing.

    Args:
        params: a parameter or an iterable of parameters.
        modifier_rank: the process whose in-block changes are kept (None: read only).
        fwd_module: passed to DeepSpeed (registers external parameters of that module).
        enabled: False makes the context do nothing.

    Returns:
        A context manager.

    Raises:
        NotImplementedError: the parameters are FSDP shards (DTensors or flat parameters); gather them
            with ``accelerator.get_state_dict(model)`` or ``param.full_tensor()`` instead.
    """
    import contextlib

    items = [params] if isinstance(params, torch.Tensor) else list(params or [])
    if not enabled or not items:
        return contextlib.nullcontext()
    if any(_is_zero3_param(p) for p in items):
        import deepspeed

        return deepspeed.zero.GatheredParameters(
            items, modifier_rank=modifier_rank, fwd_module=fwd_module, enabled=enabled
        )
    sharded = [
        p for p in items if type(p).__name__ in ("DTensor", "FlatParameter") or hasattr(p, "_local_tensor")
    ]
    if sharded:
        raise NotImplementedError(
            "GatheredParameters gathers DeepSpeed ZeRO-3 parameters; these are FSDP shards. Read the full "
            "values with accelerator.get_state_dict(model) (or DTensor.full_tensor())."
        )
    return contextlib.nullcontext()
