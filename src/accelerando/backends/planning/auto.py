"""The simulator the automatic layout asks (``choose_layout(..., simulator=...)``).

:func:`layout_simulator` returns a callable answering ``(tp, pp, dp_shard, dp_replicate)`` with the
simulated peak bytes per device of that layout (FSDP2 when anything is sharded or split, DDP
otherwise), or None for what it does not simulate (pipeline stages, a layout the model refuses); the
automatic layout then uses its formula for that one and says so in its reasons.
"""

from __future__ import annotations

from collections.abc import Callable

from accelerando.backends.planning.models import ModelSource, resolve_model
from accelerando.backends.planning.planner import simulate_scaled
from accelerando.backends.planning.spec import Candidate, TrainingShape

__all__ = ["layout_simulator"]


def layout_simulator(
    model: str,
    *,
    batch_size: int = 1,
    seq_length: int = 2048,
    mixed_precision: str = "bf16",
    optimizer: str = "adamw",
    activation_checkpointing: bool = False,
) -> Callable[[int, int, int, int], int | None]:
    """A ``(tp, pp, dp_shard, dp_replicate) -> peak bytes or None`` callable for ``choose_layout``.

    Args:
        model: what :func:`~accelerando.backends.planning.models.resolve_model` accepts (e.g. a config.json path).
        batch_size, seq_length, mixed_precision, optimizer, activation_checkpointing: the training shape
            (precisions other than ``no`` / ``bf16`` are simulated as ``bf16``).

    Raises:
        ValueError: the model cannot be resolved.
    """
    source = resolve_model(model)
    precision = mixed_precision if mixed_precision == "no" else "bf16"
    shape = TrainingShape(batch_size, seq_length, precision, optimizer, activation_checkpointing)
    cache: dict[tuple[int, int, int, int], int | None] = {}

    def peak(tp: int, pp: int, dp_shard: int, dp_replicate: int) -> int | None:
        key = (tp, pp, dp_shard, dp_replicate)
        if key not in cache:
            cache[key] = _simulated_peak(source, shape, *key)
        return cache[key]

    return peak


def _simulated_peak(
    source: ModelSource, shape: TrainingShape, tp: int, pp: int, dp_shard: int, dp_replicate: int
) -> int | None:
    if pp > 1:
        return None
    sharded = dp_shard > 1 or tp > 1
    candidate = Candidate(
        "fsdp2" if sharded else "ddp",
        tp=tp,
        dp_shard=dp_shard,
        dp_replicate=dp_replicate,
        zero_stage=3 if sharded else 0,
    )
    try:
        count, _method = simulate_scaled(source, candidate, shape)
    except ValueError:
        return None
    return count.memory.peak
