"""MegatronStrategy: the table's entry for Megatron-LM, which refuses clearly until it is supported."""

from __future__ import annotations

from typing import Any

from accelerando.enums import DistributedType
from accelerando.strategies.base import Strategy
from accelerando.strategies.megatron.train_steps import MEGATRON_UNSUPPORTED

__all__ = ["MegatronStrategy"]


class MegatronStrategy(Strategy):
    """Megatron-LM tensor / pipeline parallelism (not supported yet).

    Chosen by the connector for a ``MegatronLMPlugin`` or ``--use_megatron_lm``; building it fails
    with what to use instead, before any model is touched.

    Raises:
        NotImplementedError: always, at construction.
    """

    distributed_type = DistributedType.MEGATRON_LM
    name = "megatron"
    plain_data_parallel = False

    def __init__(self, state: Any, precision: Any, **options: Any) -> None:
        raise NotImplementedError(
            f"Megatron-LM was requested (megatron_lm_plugin or --use_megatron_lm): {MEGATRON_UNSUPPORTED}"
        )
