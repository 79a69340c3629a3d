"""Composable parallelism on a ParallelismConfig's device mesh: tensor parallel (DTensor) x FSDP2 x HSDP.

``strategy.py`` holds the strategy, ``plan.py`` the tensor-parallel plans (transformers ``tp_plan``
strings to torch ``ParallelStyle``), ``checks.py`` the model checks against ``tp_size``,
``grads.py`` clipping and optimizer steps over mixed DTensor / plain parameters.
"""

from __future__ import annotations

from accelerando.backends.strategies.composable.strategy import ComposableStrategy

__all__ = ["ComposableStrategy"]
