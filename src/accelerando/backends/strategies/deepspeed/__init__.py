"""DeepSpeed: everything of this backend, in one package.

- ``strategy.py``: :class:`DeepSpeedStrategy`, one engine per prepared model;
- ``resolve.py``: the plugin's config made concrete for ``deepspeed.initialize`` (in a fixed order);
- ``config.py``: filling and checking ``"auto"`` values of a config dict;
- ``auto_stage.py``: the automatic ZeRO stage / offload choice from model size and memory;
- ``wrappers.py``: what the script sees (``DummyOptim``, ``DummyScheduler``, engine/optimizer/scheduler
  wrappers);
- ``selection.py``: which of several named plugins is active.

The user's configuration is :class:`accelerando.plugins.deepspeed.DeepSpeedPlugin`; ``deepspeed``
itself is imported only when an engine is built (or a ZeRO-3 init context is entered).
"""

from __future__ import annotations

from accelerando.backends.strategies.deepspeed.strategy import DeepSpeedStrategy
from accelerando.plugins.deepspeed import import_deepspeed, zero_init_config

__all__ = ["DeepSpeedStrategy", "import_deepspeed", "zero_init_config"]
