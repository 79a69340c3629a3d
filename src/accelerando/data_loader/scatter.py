"""Hand each process its part of a step's batch from the main process (the dispatcher's transport).

Pickling whole batches (``scatter_object_list``) copies every tensor into a byte string and back and
costs about three times a plain tensor scatter for image-sized batches. Here only the batch's
structure travels pickled: each tensor is replaced by a :class:`_Slot` (its position, shape and dtype),
then every tensor goes as it is by point-to-point send (no copy when it is contiguous), straight into
the receiver's own tensor. The main process keeps its own part as it is.

Batches holding tensors this cannot send as raw bytes (not on the CPU, sparse, quantized, subclasses)
are pickled whole; process groups whose backend cannot send CPU tensors (NCCL without a gloo side)
use ``scatter_object_list`` as before. The result is the same, only slower.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, TypeAlias

import torch

from accelerando.common.operations import recursively_apply

if TYPE_CHECKING:
    from torch.distributed import Work

__all__ = ["Message", "Pending", "scatter_parts", "wait_all"]

# One process's item of a step: None (no more data) or (is_last, remainder, batch or None).
Message: TypeAlias = "tuple[bool, int, object] | None"
# A send under way: its request and the tensor it reads, kept alive until the send is done.
Pending: TypeAlias = "tuple[Work, torch.Tensor]"
# The first message of a step: a part pickled whole, or its skeleton with the tensors sent after it.
_Header: TypeAlias = "tuple[Literal['object'], Message] | tuple[Literal['tensors'], bool, int, object]"


@dataclass(frozen=True)
class _Slot:
    """Stands in a pickled skeleton for the ``index``-th tensor sent separately."""

    index: int
    shape: tuple[int, ...]
    dtype: torch.dtype


def _sendable(tensor: torch.Tensor) -> bool:
    return (
        type(tensor) is torch.Tensor
        and tensor.device.type == "cpu"
        and tensor.layout == torch.strided
        and not tensor.is_quantized
    )


def _as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's data as a flat uint8 tensor (a view when it is contiguous)."""
    return tensor.contiguous().reshape(-1).view(torch.uint8)


def _pack(part: object) -> tuple[object, list[torch.Tensor]] | None:
    """``(skeleton, tensors)`` of one process's part, or None when it must be pickled whole."""
    tensors: list[torch.Tensor] = []
    unsendable = False

    def slot(tensor: torch.Tensor) -> _Slot:
        nonlocal unsendable
        unsendable = unsendable or not _sendable(tensor)
        tensors.append(tensor)
        return _Slot(len(tensors) - 1, tuple(tensor.shape), tensor.dtype)

    skeleton = recursively_apply(slot, part)
    return None if unsendable else (skeleton, tensors)


def _receive(skeleton: object) -> object:
    """Receive the tensors a skeleton stands for from the main process, in order, and put them in."""
    import torch.distributed as dist

    def tensor(placed: _Slot) -> torch.Tensor:
        out = torch.empty(placed.shape, dtype=placed.dtype)
        if out.numel():
            dist.recv(out.reshape(-1).view(torch.uint8), src=0)
        return out

    return recursively_apply(tensor, skeleton, test_type=lambda leaf: isinstance(leaf, _Slot))


def scatter_parts(
    parts: list[Message] | None, rank: int, processes: int, in_flight: list[Pending] | None = None
) -> Message:
    """Give every process its item of ``parts`` (a list, one item per process, on the main process).

    Collective over the default process group: every process calls it; ``parts`` is read on rank 0
    only. Each item is ``(is_last, remainder, batch)`` or None; the batch may nest tensors in lists,
    tuples and mappings, beside other picklable values.

    Args:
        in_flight: On the main process, a list kept between calls: the sends of this call are left
            in it, still under way, and waited for at the start of the next call, so that reading the
            next step overlaps sending this one. Without it, every call waits for its own sends.

    Returns:
        This process's item.
    """
    import torch.distributed as dist

    if in_flight:
        wait_all(in_flight)
    backend = str(dist.get_backend())
    if backend != "gloo" and "cpu:gloo" not in backend:
        # NCCL and the like move only device tensors: let torch pickle everything and move it for us.
        received: list[Message] = [None]
        dist.scatter_object_list(received, parts if rank == 0 else None, src=0)
        return received[0]
    if rank == 0:
        assert parts is not None
        requests: list[Pending] = []
        for index in range(1, processes):  # the main process keeps parts[0]: nothing to pickle or copy
            item = parts[index]
            packed = _pack(item[2]) if item is not None else None
            if item is None or packed is None:
                requests += _send_object(("object", item), index)
                continue
            skeleton, tensors = packed
            requests += _send_object(("tensors", item[0], item[1], skeleton), index)
            # the tensor stays referenced beside its request until the send is done
            requests += [_start_send(data, index) for data in map(_as_bytes, tensors) if data.numel()]
        if in_flight is None:
            wait_all(requests)
        else:
            in_flight.extend(requests)
        return parts[0]
    header = _receive_object()
    if header[0] == "object":
        return header[1]
    _, is_last, remainder, skeleton = header
    return is_last, remainder, _receive(skeleton)


_HEADER_BYTES = 4096  # first message of every step: 8 bytes of length, then the pickle's start


def _start_send(data: torch.Tensor, dst: int) -> Pending:
    import torch.distributed as dist

    request = dist.isend(data, dst=dst)
    assert request is not None  # None only on a process outside the group; the default group has all
    return request, data


def _send_object(obj: _Header, dst: int) -> list[Pending]:
    """Start sending a pickled object to ``dst``; returns the ``(request, tensor)`` pairs.

    Point-to-point instead of ``scatter_object_list``, whose three collectives cost about 1.7 ms per
    step even for a few bytes over gloo. One fixed-size message carries the length and, for the usual
    small skeleton, the whole pickle; a longer pickle sends its rest in a second message.
    """
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    head = bytearray(_HEADER_BYTES)
    head[:8] = len(data).to_bytes(8, "little")
    inline = min(len(data), _HEADER_BYTES - 8)
    head[8 : 8 + inline] = data[:inline]
    first = torch.frombuffer(head, dtype=torch.uint8)
    requests = [_start_send(first, dst)]
    if len(data) > inline:
        rest = torch.frombuffer(bytearray(data[inline:]), dtype=torch.uint8)
        requests.append(_start_send(rest, dst))
    return requests


def wait_all(requests: list[Pending]) -> None:
    """Wait for the ``(request, tensor)`` pairs of earlier sends and empty the list."""
    for request, _ in requests:
        request.wait()
    requests.clear()


def _receive_object() -> _Header:
    import torch.distributed as dist

    first = torch.empty(_HEADER_BYTES, dtype=torch.uint8)
    dist.recv(first, src=0)
    head = first.numpy().tobytes()
    length = int.from_bytes(head[:8], "little")
    inline = min(length, _HEADER_BYTES - 8)
    data = head[8 : 8 + inline]
    if length > inline:
        rest = torch.empty(length - inline, dtype=torch.uint8)
        dist.recv(rest, src=0)
        data += rest.numpy().tobytes()
    return pickle.loads(data)
