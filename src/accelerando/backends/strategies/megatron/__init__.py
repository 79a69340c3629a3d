"""Megatron-LM over megatron-core: the strategy, the engine and the reference's ``accelerate.utils.megatron_lm`` names.

- ``strategy.py``: :class:`MegatronStrategy` (``prepare`` builds the engine; refuses without megatron-core / CUDA).
- ``args.py``: the Megatron-LM argument namespace (plugin arguments + defaults + derived sizes).
- ``config.py``: megatron-core's ``TransformerConfig`` / ``OptimizerConfig`` / DDP config / schedule from it.
- ``models.py``: megatron-core's GPT / BERT / T5 models per (virtual) pipeline stage.
- ``setup.py``: initialisation (model-parallel groups, seeds) and the ``prepare_*`` builders.
- ``engine.py``: the engine (train / eval steps through megatron-core's schedules, checkpoints) and
  the optimizer / scheduler wrappers.
- ``train_steps.py``: GPT / BERT / T5 train steps, dummy scheduler / dataloader (plain torch parts).
- ``parallel.py``: loss averaging and gathering over the data-parallel group.
- ``requirements.py``: the refusal and its message (names the torch-native alternatives).

The user's configuration is :class:`accelerando.plugins.megatron.MegatronLMPlugin`; the names are
re-exported at ``accelerando.utils.megatron_lm``. megatron-core is imported only inside functions.
"""

from __future__ import annotations

from accelerando.backends.strategies.megatron.strategy import MegatronStrategy

__all__ = ["MegatronStrategy"]
