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
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from typing import Any

import torch

__all__ = [
    "TensorInformation",
    "broadcast",
    "broadcast_object_list",
    "concatenate",
    "convert_outputs_to_fp32",
    "convert_to_fp32",
    "find_batch_size",
    "gather",
    "gather_object",
    "honor_type",
    "is_namedtuple",
    "is_tensor_information",
    "is_torch_tensor",
    "listify",
    "pad_across_processes",
    "recursively_apply",
    "reduce",
    "send_to_device",
    "slice_tensors",
    "wait_for_everyone",
]


@dataclasses.dataclass(frozen=True)
class TensorInformation:
    """Shape and dtype of a tensor, standing in for it where only the layout travels.

    Attributes:
        shape: the tensor's shape.
        dtype: the tensor's dtype.
    """

    shape: torch.Size
    dtype: torch.dtype


def is_torch_tensor(data: Any) -> bool:
    """Tell whether ``data`` is a ``torch.Tensor``.

    Args:
        data: anything.

    Returns:
        True for tensors (parameters included).
    """
    return isinstance(data, torch.Tensor)


def is_tensor_information(data: Any) -> bool:
    """Tell whether ``data`` is a :class:`TensorInformation`.

    Args:
        data: anything.

    Returns:
        True for ``TensorInformation`` instances.
    """
    return isinstance(data, TensorInformation)


def is_namedtuple(data: Any) -> bool:
    """Tell whether ``data`` is an instance of a ``collections.namedtuple`` / ``typing.NamedTuple``.

    Args:
        data: anything.

    Returns:
        True for named tuples.
    """
    return isinstance(data, tuple) and hasattr(data, "_fields") and hasattr(type(data), "_make")


def honor_type(obj: Sequence[Any], generator: Any) -> Sequence[Any]:
    """Build a sequence of the same type as ``obj`` from the items of ``generator``.

    Named tuples take their items as positional arguments; other sequence types take one iterable.

    Args:
        obj: the sequence whose type to reproduce.
        generator: an iterable of the new items.

    Returns:
        A new sequence of ``type(obj)``.
    """
    if is_namedtuple(obj):
        return type(obj)(*list(generator))
    return type(obj)(generator)


def _rebuild_mapping(data: Mapping[Any, Any], items: dict[Any, Any]) -> Mapping[Any, Any]:
    try:
        return type(data)(items)
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
    func: Callable[..., Any],
    data: Any,
    *args: Any,
    test_type: Callable[[Any], bool] = is_torch_tensor,
    error_on_other_type: bool = False,
    **kwargs: Any,
) -> Any:
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

    def walk(item: Any) -> Any:
        if isinstance(item, (tuple, list)):
            return honor_type(item, (walk(o) for o in item))
        if isinstance(item, Mapping):
            return _rebuild_mapping(item, {k: walk(v) for k, v in item.items()})
        if test_type(item):
            return func(item, *args, **kwargs)
        if error_on_other_type:
            raise TypeError(
                f"Cannot apply {getattr(func, '__name__', func)} to an object of type {type(item).__name__}: "
                "only nested lists/tuples/dicts whose leaves are tensors are supported. Convert it to a "
                "tensor first (or use gather_object / broadcast_object_list for arbitrary objects)."
            )
        return item

    return walk(data)


def _move(obj: Any, device: torch.device | str | int, non_blocking: bool) -> Any:
    if isinstance(device, str) and device == "npu":
        # torch_npu cannot find the current device context for a bare "npu" on first use.
        device = "npu:0"
    try:
        return obj.to(device, non_blocking=non_blocking)
    except TypeError:
        # Objects whose .to() does not take non_blocking (e.g. some tokenizer outputs).
        return obj.to(device)


def send_to_device(
    tensor: Any,
    device: torch.device | str | int,
    non_blocking: bool = False,
    skip_keys: list[str] | str | None = None,
) -> Any:
    """Move every tensor (or object with a ``.to`` method) of a nested structure to ``device``.

    Args:
        tensor: a tensor or a nesting of lists, tuples, named tuples, mappings and dataclasses.
            Leaves without ``.to`` (numbers, strings, ...) are left as they are.
        device: the target device.
        non_blocking: ask for an asynchronous copy (pinned CPU memory to GPU).
        skip_keys: mapping keys (one or a list) whose values are not moved, at any depth.

    Returns:
        The same structure, with its tensors on ``device``.
    """
    if isinstance(skip_keys, str):
        skip_keys = [skip_keys]
    skip = frozenset(skip_keys or ())

    def walk(item: Any) -> Any:
        if isinstance(item, torch.Tensor):
            return _move(item, device, non_blocking)
        if isinstance(item, Mapping) and (skip or not hasattr(item, "to")):
            return _rebuild_mapping(item, {k: v if k in skip else walk(v) for k, v in item.items()})
        if hasattr(item, "to") and callable(item.to) and not isinstance(item, type):
            return _move(item, device, non_blocking)
        if isinstance(item, (tuple, list)):
            return honor_type(item, (walk(o) for o in item))
        if dataclasses.is_dataclass(item) and not isinstance(item, type):
            changes = {f.name: walk(getattr(item, f.name)) for f in dataclasses.fields(item) if f.init}
            return dataclasses.replace(item, **changes)
        return item

    return walk(tensor)


def _convert_to_list(tensor: torch.Tensor) -> Any:
    tensor = tensor.detach().cpu()
    if tensor.dtype == torch.bfloat16:
        # numpy-backed tolist() has no bfloat16.
        tensor = tensor.float()
    return tensor.tolist()


def listify(data: Any) -> Any:
    """Turn every tensor of a nested structure into nested Python lists (or a number for 0-d).

    Args:
        data: a tensor or a nesting of lists, tuples and mappings of tensors.

    Returns:
        The same structure with plain Python values in place of tensors.
    """
    return recursively_apply(_convert_to_list, data)


def _is_half(tensor: Any) -> bool:
    return isinstance(tensor, torch.Tensor) and tensor.dtype in (torch.float16, torch.bfloat16)


def convert_to_fp32(tensor: Any) -> Any:
    """Convert every float16 / bfloat16 tensor of a nested structure to float32.

    Args:
        tensor: a tensor or a nesting of lists, tuples and mappings; other leaves pass unchanged.

    Returns:
        The same structure with half-precision tensors upcast.
    """
    return recursively_apply(lambda t: t.float(), tensor, test_type=_is_half)


def convert_outputs_to_fp32(model_forward: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a forward function so that its half-precision outputs come back as float32.

    The wrapper keeps the wrapped function in ``__wrapped__`` so it can be removed again.

    Args:
        model_forward: the forward function (usually a bound ``model.forward``).

    Returns:
        The wrapping function.
    """

    @functools.wraps(model_forward)
    def forward(*args: Any, **kwargs: Any) -> Any:
        return convert_to_fp32(model_forward(*args, **kwargs))

    return forward


def _tensor_leaves(data: Any, strict: bool = False) -> list[torch.Tensor]:
    # With strict, a non-tensor leaf raises here, before any process enters a collective.
    leaves: list[torch.Tensor] = []
    recursively_apply(leaves.append, data, error_on_other_type=strict)
    return leaves


def find_batch_size(data: Any) -> int:
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
    data: Any,
    tensor_slice: slice | int | Any,
    process_index: int | None = None,
    num_processes: int | None = None,
) -> Any:
    """Index every tensor of a nested structure with ``tensor_slice`` (along the first dimension).

    Args:
        data: a tensor or a nesting of lists, tuples and mappings of tensors.
        tensor_slice: what to index with, e.g. ``slice(0, 8)``.
        process_index: accepted for API compatibility; unused.
        num_processes: accepted for API compatibility; unused.

    Returns:
        The same structure with each tensor replaced by ``tensor[tensor_slice]``.
    """
    return recursively_apply(lambda t: t[tensor_slice], data)


def concatenate(data: Sequence[Any], dim: int = 0) -> Any:
    """Concatenate a list of structures of the same layout leaf by leaf.

    Args:
        data: a non-empty list of tensors, or of nested lists/tuples/mappings with the same layout.
        dim: the dimension to concatenate along.

    Returns:
        One structure of that layout whose tensors are the concatenations.

    Raises:
        ValueError: if ``data`` is empty.
        TypeError: if a leaf is not a tensor.
    """
    if len(data) == 0:
        raise ValueError("concatenate needs at least one structure; got an empty list.")
    first = data[0]
    if isinstance(first, (tuple, list)):
        return honor_type(first, (concatenate([d[i] for d in data], dim=dim) for i in range(len(first))))
    if isinstance(first, Mapping):
        return _rebuild_mapping(first, {k: concatenate([d[k] for d in data], dim=dim) for k in first})
    if not isinstance(first, torch.Tensor):
        raise TypeError(f"Can only concatenate tensors, but got {type(first).__name__}.")
    return torch.cat(list(data), dim=dim)


# --- communication ---------------------------------------------------------------------------------


def _state() -> Any:
    from accelerando.state import PartialState

    return PartialState()


def _distributed() -> Any | None:
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
    layouts: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(layouts, [(tuple(t.shape), str(t.dtype)) for t in tensors])
    detail = "; ".join(f"process {rank}: {layout}" for rank, layout in enumerate(layouts))
    raise ValueError(
        f"Cannot {what}: the processes hold tensors of different shapes or dtypes ({detail}). "
        "Call pad_across_processes(tensor, dim=...) first so every process has the same shape, "
        "or use gather_object for data of varying shapes."
    )


def _comm_device(tensors: list[torch.Tensor], state: Any) -> torch.device:
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


def gather(tensor: Any) -> Any:
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
    return recursively_apply(_all_gather_tensor, tensor, error_on_other_type=True)


def gather_object(object: Any) -> list[Any]:
    """Gather picklable objects from all processes.

    A list (or tuple) passed by a process contributes its items; any other object contributes
    itself. So ``gather_object([x])`` and ``gather_object(x)`` both give one entry per process.

    Args:
        object: any picklable object.

    Returns:
        A list of the contributions of every process, in rank order. In a single process: the items
        of ``object`` when it is a list or tuple, else ``[object]``.
    """
    state = _distributed()
    if state is None:
        return list(object) if isinstance(object, (list, tuple)) else [object]
    import torch.distributed as dist

    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, object)
    result: list[Any] = []
    for contribution in gathered:
        if isinstance(contribution, (list, tuple)):
            result.extend(contribution)
        else:
            result.append(contribution)
    return result


def _check_source(from_process: int, state: Any) -> None:
    if not 0 <= from_process < state.num_processes:
        raise ValueError(
            f"from_process={from_process} is not a process of this run; use a rank in [0, {state.num_processes - 1}]."
        )


def broadcast(tensor: Any, from_process: int = 0) -> Any:
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

    return recursively_apply(one, tensor, error_on_other_type=True)


def broadcast_object_list(object_list: list[Any], from_process: int = 0) -> list[Any]:
    """Replace, in place, the items of ``object_list`` on every process by those of ``from_process``.

    Args:
        object_list: a list of picklable objects, of the same length on every process.
        from_process: the rank whose objects are sent.

    Returns:
        ``object_list``, updated in place.

    Raises:
        TypeError: if ``object_list`` is not a list.
        ValueError: if ``from_process`` is not a valid rank.
    """
    if not isinstance(object_list, list):
        raise TypeError(
            f"broadcast_object_list updates a list in place; got {type(object_list).__name__}. Wrap it: [obj]."
        )
    state = _distributed()
    if state is None:
        return object_list
    _check_source(from_process, state)
    import torch.distributed as dist

    dist.broadcast_object_list(object_list, src=from_process)
    return object_list


_REDUCTIONS = ("mean", "sum", "none", None)


def reduce(tensor: Any, reduction: str | None = "mean", scale: float = 1.0) -> Any:
    """Reduce every tensor of a nested structure across processes.

    The input is not modified: a reduced copy is returned. Each process's tensor is multiplied by
    ``scale`` before reducing. ``"sum"`` adds the processes' tensors; ``"mean"`` divides that sum by
    the number of processes (integer tensors become floating point); ``"none"`` / ``None`` sums without
    dividing, as the reference does.

    Args:
        tensor: a tensor or a nesting of lists, tuples and mappings of same-shaped tensors.
        reduction: ``"mean"``, ``"sum"`` or ``"none"``.
        scale: a factor applied to each process's tensor before the reduction.

    Returns:
        The reduced copies (in a single process: scaled copies of the inputs).

    Raises:
        ValueError: if ``reduction`` is not one of the accepted values, or shapes differ.
        TypeError: if a leaf is not a tensor.
    """
    if reduction not in _REDUCTIONS:
        raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}.")
    state = _distributed()
    if state is not None:
        leaves = _tensor_leaves(tensor, strict=True)
        _check_same_layout(leaves, _comm_device(leaves, state), "reduce")
    num_processes = state.num_processes if state is not None else 1

    def one(t: torch.Tensor) -> torch.Tensor:
        result = t.clone() if scale == 1.0 else t * scale
        result = result.contiguous()
        if state is not None:
            import torch.distributed as dist

            dist.all_reduce(result, op=dist.ReduceOp.SUM)
        if reduction == "mean":
            result = result / num_processes
        return result

    return recursively_apply(one, tensor, error_on_other_type=True)


def _pad_one(tensor: torch.Tensor, dim: int, pad_index: int, pad_first: bool) -> torch.Tensor:
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


def pad_across_processes(tensor: Any, dim: int = 0, pad_index: int = 0, pad_first: bool = False) -> Any:
    """Pad tensors along ``dim`` to the largest size any process holds, so they can be gathered.

    Tensors with fewer than ``dim + 1`` dimensions are returned unchanged.

    Args:
        tensor: a tensor or a nesting of lists, tuples and mappings of tensors (same layout and
            number of dimensions on every process).
        dim: the dimension to pad.
        pad_index: the value to pad with.
        pad_first: pad at the start of the dimension instead of the end.

    Returns:
        The same structure with padded tensors (in a single process, ``tensor`` itself).

    Raises:
        TypeError: if a leaf is not a tensor.
    """
    if _distributed() is None:
        return tensor
    return recursively_apply(
        _pad_one, tensor, dim=dim, pad_index=pad_index, pad_first=pad_first, error_on_other_type=True
    )
