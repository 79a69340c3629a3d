"""Checkpoint loading where only rank 0 reads the files and the other ranks receive by broadcast."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

__all__ = ["broadcast_checkpoint"]


def broadcast_checkpoint(loader, resolve_files: Callable[[], list[str]], iter_file: Callable) -> None:
    """Feed ``loader.place`` on every rank with tensors read on rank 0 only.

    Rank 0 announces each file's tensor names, shapes and dtypes, then broadcasts the tensors one at a
    time, so no rank ever holds more than one extra tensor. Tensors kept on disk in place are
    announced by name and indexed by every rank (the file path is shared).

    Args:
        loader: the ``_Loader`` of the current load (its ``resolve`` and ``place`` are used).
        resolve_files: returns the weight files; called on rank 0 only (other ranks may not see them).
        iter_file: the per-file iterator of the loading module.
    """
    backend_device = (
        torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None
    )
    rank = dist.get_rank()
    files = [resolve_files() if rank == 0 else None]
    dist.broadcast_object_list(files, src=0)
    paths = files[0]
    assert paths is not None  # every rank holds rank 0's list after the broadcast
    for path in paths:
        items = list(iter_file(path, loader.resolve)) if rank == 0 else []
        meta = [
            [
                (name, None if tensor is None else (tuple(tensor.shape), tensor.dtype), source)
                for name, tensor, source in items
            ]
        ]
        dist.broadcast_object_list(meta, src=0)
        for position, (name, spec, source) in enumerate(meta[0]):
            if spec is None:
                loader.place(name, None, source)
                continue
            tensor = items[position][1].contiguous() if rank == 0 else torch.empty(spec[0], dtype=spec[1])
            wire = tensor if backend_device is None else tensor.to(backend_device)
            dist.broadcast(wire, src=0)
            loader.place(name, wire if backend_device is None else wire.cpu(), None)
