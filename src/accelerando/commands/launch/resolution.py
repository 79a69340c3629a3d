"""From parsed launch arguments to resolved settings and a launch plan.

Settings are resolved with defaults < config file < environment < CLI flags (< settings a named
launcher implies); :func:`plan_for` then asks :func:`accelerando.launchers.plan.build` for the plan
and adds the compatibility variables. Heavy imports (yaml, the planner) happen inside the functions.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from typing import TYPE_CHECKING

from accelerando.commands.launch.flags import compat_env
from accelerando.commands.launch.parser import is_given
from accelerando.core.settings.configfile import find_config_file, load_config_layer
from accelerando.core.settings.fields import FIELDS
from accelerando.core.settings.machine import detect_machine
from accelerando.core.settings.resolve import Sourced, env_layer, resolve
from accelerando.launchers.plan import Command, build, check_command

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from accelerando.core.settings.resolve import Settings
    from accelerando.launchers.mpirun import MpiRun
    from accelerando.launchers.plan import LaunchPlan

__all__ = ["cli_layer", "command_of", "plan_for", "resolve_launch_settings"]


def cli_layer(args: argparse.Namespace) -> dict[str, Sourced]:
    """The settings given as flags in ``args``, each tagged with its flag as the source.

    Args:
        args: the parsed launch arguments.

    Returns:
        Setting name -> :class:`~accelerando.core.settings.resolve.Sourced` (``cli:--flag``), given ones only.
    """
    layer: dict[str, Sourced] = {}
    for field in FIELDS:
        value = getattr(args, field.name, None) if field.cli else None
        if is_given(field, value):
            layer[field.name] = Sourced(value, "cli:" + str(field.cli))
    return layer


def resolve_launch_settings(
    args: argparse.Namespace, forced: Mapping[str, object] | None = None
) -> tuple[Settings, list[str]]:
    """Resolve the launcher's settings: defaults < config file < environment < CLI flags.

    Args:
        args: the parsed launch arguments.
        forced: settings a named launcher implies (``deepspeed_launcher``: ``use_deepspeed``), on top.

    Returns:
        ``(settings, notes)``; notes are sentences for the user (e.g. which config file was used).

    Raises:
        ValueError: a bad config file (:class:`~accelerando.core.settings.configfile.ConfigError`) or a
            bad value from any layer; the message names the source and the fix.
    """
    path, note = find_config_file(getattr(args, "config_file", None))
    notes = [note] if note else []
    config = load_config_layer(path) if path is not None else {}
    implied = {name: Sourced(value, "launcher") for name, value in (forced or {}).items()}
    return resolve([config, env_layer(), cli_layer(args), implied], warn_sources=()), notes


def command_of(args: argparse.Namespace) -> Command:
    """The :class:`~accelerando.launchers.plan.Command` each process of ``args`` runs.

    Args:
        args: the parsed launch arguments (``training_script`` set).

    Returns:
        The command: target, its arguments, and whether it is a module or a program run directly.
    """
    return Command(
        args.training_script,
        tuple(getattr(args, "training_script_args", None) or ()),
        bool(getattr(args, "module", False)),
        bool(getattr(args, "no_python", False)),
    )


def plan_for(
    args: argparse.Namespace,
    forced: Mapping[str, object] | None = None,
    *,
    find_mpirun: Callable[[], MpiRun] | None = None,
) -> tuple[Settings, LaunchPlan]:
    """Resolve the settings of ``args`` and plan the launch.

    Args:
        args: the parsed launch arguments (``training_script`` set).
        forced: settings a named launcher implies, on top of every other layer.
        find_mpirun: finds ``mpirun`` for a ``mpirun_hostfile`` launch (default: look on ``PATH``);
            validation passes one that does not look, since nothing starts then.

    Returns:
        ``(settings, plan)``: the resolved settings and the :class:`~accelerando.launchers.plan.LaunchPlan`,
        with the compatibility variables in its environment and the config-file note in its notes.

    Raises:
        ValueError: a bad value, config file or combination, or a target that cannot be run.
        KeyError: a setting the planner needs is missing (the message names it).
    """
    settings, notes = resolve_launch_settings(args, forced)
    command = command_of(args)
    agent_options = [
        f"--{k}={getattr(args, k)}" for k in ("role", "tee", "log_dir") if getattr(args, k, None)
    ]
    machine = detect_machine()
    if find_mpirun is None:
        plan = build(settings, command, machine, agent_options=agent_options)
    else:
        plan = build(settings, command, machine, agent_options=agent_options, mpirun=find_mpirun)
    check_command(command, settings)
    return settings, replace(plan, env={**plan.env, **compat_env(args)}, notes=(*notes, *plan.notes))
