"""Megatron-LM: the strategy entry and the reference's ``accelerate.utils.megatron_lm`` names.

- ``strategy.py``: :class:`MegatronStrategy` (refuses at ``prepare`` without megatron-core and CUDA).
- ``train_steps.py``: GPT / BERT / T5 train steps, dummy scheduler / dataloader (plain torch parts).
- ``parallel.py``: loss averaging and gathering over the data-parallel group.
- ``engine.py``: the engine and the optimizer / scheduler wrappers.
- ``setup.py``: initialisation and the ``prepare_*`` builders (megatron-core only).
- ``requirements.py``: the refusal and its message.

The user's configuration is :class:`accelerando.plugins.megatron.MegatronLMPlugin`; the names are
re-exported at ``accelerando.utils.megatron_lm``.
"""

from __future__ import annotations

from accelerando.strategies.megatron.strategy import MegatronStrategy

__all__ = ["MegatronStrategy"]
