"""MegatronStrategy: the connector's entry for Megatron-LM; it refuses at ``prepare`` where megatron-core cannot run."""

from __future__ import annotations

from typing import Any, NoReturn

import torch

from accelerando.enums import DistributedType
from accelerando.strategies.base import Prepared, PrepareRequest, Strategy
from accelerando.strategies.megatron.requirements import refuse_megatron

__all__ = ["MegatronStrategy"]


class MegatronStrategy(Strategy):
    """Megatron-LM tensor / pipeline parallelism over megatron-core.

    Chosen by the connector for a ``MegatronLMPlugin`` or ``--use_megatron_lm``. Creating the
    Accelerator succeeds (its settings can be inspected); the first ``prepare`` refuses, before any
    object is touched, naming what is missing (megatron-core, CUDA) and the torch-native
    alternatives: ``ParallelismConfig(tp_size=...)`` for tensor parallelism and
    ``PipelineParallelPlugin`` for pipeline parallelism. There is never a silent fallback to DDP.
    """

    distributed_type = DistributedType.MEGATRON_LM
    name = "megatron"
    plain_data_parallel = False

    def _refuse(self) -> NoReturn:
        refuse_megatron("Megatron-LM training (megatron_lm_plugin or --use_megatron_lm)")

    def prepare_all(self, request: PrepareRequest) -> Prepared | None:
        """Refuse: see the class. Raises MegatronLMUnavailableError."""
        self._refuse()

    def prepare_model(
        self, model: torch.nn.Module, device_placement: bool = True, evaluation_mode: bool = False
    ) -> torch.nn.Module:
        """Refuse: see the class. Raises MegatronLMUnavailableError."""
        self._refuse()

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer) -> Any:
        """Refuse: see the class. Raises MegatronLMUnavailableError."""
        self._refuse()
