"""Megatron-LM: the strategy entry and the reference's Megatron-LM names, all placeholders for now.

``strategy.py`` holds :class:`MegatronStrategy` (refuses at construction, naming the alternatives);
``train_steps.py`` the train steps, dummy scheduler / dataloader re-exported at
``accelerando.utils.megatron_lm``. The user's configuration is
:class:`accelerando.plugins.megatron.MegatronLMPlugin`.
"""

from __future__ import annotations

from accelerando.strategies.megatron.strategy import MegatronStrategy

__all__ = ["MegatronStrategy"]
