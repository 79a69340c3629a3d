"""Launch plans: turn resolved settings and a command into the processes to start.

:func:`build` is pure: given the :class:`~accelerando.core.settings.Settings` the launcher resolved
(defaults < config file < environment < CLI flags), the user's command and a description of the
machine, it returns a :class:`LaunchPlan` (the command line and the environment variables for the
processes) without starting anything, so every rule is tested without spawning. :func:`run` executes
a plan: one process directly, several through PyTorch's elastic agent (``torch.distributed.run``).

The launch plan is the only place that writes environment variables for the processes: every value
some layer set is exported as ``ACCELERANDO_<NAME>`` and under the reference project's name with the
reference's spelling (``ACCELERATE_MIXED_PRECISION``, ``FSDP_*``, ``ACCELERATE_DEEPSPEED_*``,
``ACCELERATE_DYNAMO_*``, ``MEGATRON_LM_*``, ``PARALLELISM_CONFIG_*``, ``ACCELERATE_FP8_*``, ...), so
code written for the reference (transformers among it) reads what it expects. The variables the
reference's launcher always writes (mixed precision and the dynamo options) are written with their
default when nothing set them; :data:`~accelerando.core.settings.resolve.ECHOED_DEFAULTS_ENV` lists those,
so each process still reads them as "not set".

Modes: ``simple`` (one process), ``elastic`` (``torch.distributed.run``), ``deepspeed`` (DeepSpeed's
multi-machine runner) and ``mpirun`` (a multi-CPU job started by ``mpirun --hostfile``).

The package, by subject: :mod:`~accelerando.launchers.plan.spec` (the records), ``checks`` (the
refusals), ``environment`` (the variables the processes get), ``argv`` (the command lines), ``notes``
(what the user is told) and ``build`` (the entry point that puts them together).
"""

from __future__ import annotations

from accelerando.launchers.plan.argv import rendezvous_backend
from accelerando.launchers.plan.build import build
from accelerando.launchers.plan.checks import (
    RANGE_RDZV_BACKEND,
    check_command,
    check_files,
    check_settings,
    machine_counts,
)
from accelerando.launchers.plan.environment import INSTALL_ENV, export_env, loopback_sockets, reference_env
from accelerando.launchers.plan.notes import automatic_layout, oversubscription_warning
from accelerando.launchers.plan.spec import Command, LaunchPlan

__all__ = [
    "Command",
    "LaunchPlan",
    "build",
    "check_command",
    "check_files",
    "check_settings",
    "export_env",
    "reference_env",
    "INSTALL_ENV",
    "automatic_layout",
    "machine_counts",
    "loopback_sockets",
    "oversubscription_warning",
    "rendezvous_backend",
    "RANGE_RDZV_BACKEND",
]
