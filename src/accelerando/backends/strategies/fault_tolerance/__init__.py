"""Per-step fault tolerance across replica groups, on torchft (imported only when this strategy is chosen).

- :mod:`.manager`: torchft's ``Manager`` for this replica group (its store, lighthouse, process group).
- :mod:`.optimizer`: the optimizer wrapper that joins each step's quorum and commits or drops the step.
- :mod:`.strategy`: :class:`FaultTolerantStrategy`, chosen by the connector for ``--fault_tolerance``
  or a ``FaultTolerancePlugin``; :func:`current_step` reads the committed step count of a run.
"""

from __future__ import annotations

from accelerando.backends.strategies.fault_tolerance.strategy import FaultTolerantStrategy, current_step

__all__ = ["FaultTolerantStrategy", "current_step"]
