"""DeepSpeed Ulysses sequence parallelism: each sequence-parallel rank reads its slice of every batch."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch

from accelerando.backends.strategies.base import SEQUENCE_PARALLEL_NEEDED
from accelerando.parallelism_config import SP_BACKEND_DEEPSPEED

if TYPE_CHECKING:
    from accelerando.parallelism_config import ParallelismConfig

__all__ = ["ulysses_dataloader"]


def ulysses_dataloader(
    dl: torch.utils.data.DataLoader,
    model: torch.nn.Module,
    parallelism_config: ParallelismConfig | None,
    device: torch.device,
) -> Iterable[object]:
    """Wrap a prepared dataloader in DeepSpeed's ``UlyssesSPDataLoaderAdapter`` (the sequence-parallel group DeepSpeed set up).

    Raises:
        ValueError: no ``ParallelismConfig`` with ``sp_size > 1`` and ``sp_backend="deepspeed"``.
        ImportError: DeepSpeed (>= 0.18.2, with Ulysses sequence parallelism) is not installed.
        RuntimeError: DeepSpeed has no sequence-parallel group (Ulysses was not set up).
    """
    config = parallelism_config
    if config is None or not config.sp_enabled or config.sp_backend != SP_BACKEND_DEEPSPEED:
        raise ValueError(SEQUENCE_PARALLEL_NEEDED)
    try:
        from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPDataLoaderAdapter
        from deepspeed.utils import groups
    except ImportError as exc:
        raise ImportError(
            "sequence parallelism needs DeepSpeed Ulysses: pip install 'deepspeed>=0.18.2'"
        ) from exc
    try:
        sp_group = groups._get_sequence_parallel_group()
    except (KeyError, AssertionError, AttributeError) as exc:
        raise RuntimeError(
            "DeepSpeed has no sequence-parallel group: Ulysses sequence parallelism must be set up "
            "(DeepSpeed on GPUs, with the model's attention registered for Ulysses) before its "
            "dataloaders are adapted"
        ) from exc
    return UlyssesSPDataLoaderAdapter(
        dl,
        sp_rank=groups._get_sequence_parallel_rank(),
        sp_group=sp_group,
        sp_world_size=groups._get_sequence_parallel_world_size(),
        device=getattr(model, "device", device),
    )
