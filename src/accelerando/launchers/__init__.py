"""Launchers: start a training function or script in one or many processes.

- ``notebook_launcher`` / ``debug_launcher``: run a function in N processes from a notebook, a REPL
  or a test; ``test_launch()`` checks that a process can set up its state.
- ``plan.build(settings, command, machine) -> LaunchPlan``: the pure launch planner behind
  ``accelerando launch``; ``runner.run(plan)`` executes a plan.
"""

from __future__ import annotations

from accelerando.core._lazy import lazy_getattr

_EXPORTS = {
    "notebook_launcher": "accelerando.launchers.notebook",
    "debug_launcher": "accelerando.launchers.notebook",
    "test_launch": "accelerando.launchers.notebook",
    "ELASTIC_LOG_LINE_PREFIX_TEMPLATE_PYTORCH_VERSION": "accelerando.launchers.notebook",
    "LaunchPlan": "accelerando.launchers.plan",
    "Command": "accelerando.launchers.plan",
    "build": "accelerando.launchers.plan",
    "run": "accelerando.launchers.runner",
}

__all__ = list(_EXPORTS)

__getattr__ = lazy_getattr(__name__, _EXPORTS, globals(), submodules=True)
