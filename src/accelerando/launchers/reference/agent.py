"""The options of ``torch.distributed.run`` (torchrun's agent) from a launch plan, stored on ``args``."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from accelerando.launchers.plan import LaunchPlan

__all__ = ["set_agent_args", "with_restarts"]

# Types torch.distributed.run's parser gives its options (the plan holds them as text).
_AGENT_TYPES: dict[str, Callable[[str], object]] = {
    "max_restarts": int,
    "monitor_interval": float,
}  # master_port stays text, as the reference stores it


def set_agent_args(args: argparse.Namespace, plan: LaunchPlan) -> None:
    """Store the plan's ``torch.distributed.run`` options on ``args`` (as torchrun's own parser names them)."""
    agent = plan.agent_args
    index = 0
    while index < len(agent) and agent[index].startswith("--"):
        option = agent[index][2:]
        if "=" in option:
            key, value = option.split("=", 1)
            index += 1
        elif option in ("module", "no_python", "standalone"):
            key, value = option, "true"
            index += 1
        else:
            key, value = option, agent[index + 1]
            index += 2
        setattr(args, key, _AGENT_TYPES.get(key, str)(value) if value != "true" else True)
    args.nproc_per_node = str(plan.nproc_per_node)
    args.node_rank = int(plan.machine_rank)
    # The agent's other options at their defaults, so that torch.distributed.run.run(args) works.
    from torch.distributed.run import get_args_parser

    for key, value in vars(
        get_args_parser().parse_args([str(getattr(args, "training_script", None) or "script.py")])
    ).items():
        if not hasattr(args, key):
            setattr(args, key, value)


def with_restarts(plan: LaunchPlan, restarts: int) -> LaunchPlan:
    """The plan of a one-process elastic launch, with the restart count the user asked for."""
    argv = list(plan.argv)
    if "--max_restarts" in argv:
        argv[argv.index("--max_restarts") + 1] = str(restarts)
    return replace(plan, argv=tuple(argv))
