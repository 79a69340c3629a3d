"""The entry points of ``accelerando launch``: the CLI subcommand, ``python -m``, and :func:`run`.

:func:`run` checks the parsed arguments, then emits a job (``--emit``), prints the plan
(``--dry_run``) or hands the plan to :func:`accelerando.launchers.runner.run`. Usage and configuration
errors are printed and answered with exit status 2; nothing raises to the user.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from accelerando.commands.launch.dry_run import print_dry_run
from accelerando.commands.launch.emit import emit
from accelerando.commands.launch.flags import refused_message
from accelerando.commands.launch.parser import (
    CustomHelpFormatter,
    build_parser,
    parse,
    parser_for,
    unknown_flags_message,
)
from accelerando.commands.launch.resolution import command_of, plan_for
from accelerando.core.settings.fields import FIELDS
from accelerando.launchers import runner
from accelerando.launchers.limits import check_exec_size
from accelerando.launchers.plan import check_files

if TYPE_CHECKING:
    from collections.abc import Mapping

    from accelerando.core.settings.resolve import Settings
    from accelerando.launchers.ft import FaultTolerantPlan
    from accelerando.launchers.plan import LaunchPlan

__all__ = ["add_parser", "main", "run", "script_problem"]


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Register ``accelerando launch`` on the CLI's subparsers.

    Args:
        subparsers: the object returned by ``ArgumentParser.add_subparsers()``.

    Returns:
        The new subparser.
    """
    parser = subparsers.add_parser("launch", help="Launch a script.", formatter_class=CustomHelpFormatter)
    build_parser(parser)
    parser.set_defaults(func=run)
    return parser


def _usage_error(args: argparse.Namespace) -> str:
    """The message for a missing script, unknown flags or refused flags in ``args``; ``""`` if none."""
    if not args.training_script:
        return "accelerando launch: no script given. Fix: `accelerando launch [flags] script.py [args]`."
    extra = list(getattr(args, "unknown_args", []) or [])
    if extra:
        return unknown_flags_message(extra)
    return refused_message(args)


def script_problem(args: argparse.Namespace, plan: LaunchPlan | None = None) -> str:
    """Why the script of ``args`` cannot be started on this machine, or ``""``.

    Checked before any process starts, so a mistyped path is one line instead of one traceback per
    process. A module (``-m``), a program (``--no_python``) and a job that DeepSpeed's runner starts
    on other hosts are not checked here.

    Args:
        args: the parsed launch arguments (``training_script`` set).
        plan: the launch plan, when built (its mode tells whether other hosts start the script).

    Returns:
        One sentence naming the path, what is wrong and the fix; ``""`` when the script can be read.
    """
    import os

    if getattr(args, "module", False) or getattr(args, "no_python", False):
        return ""
    if plan is not None and plan.uses_backend_runner:
        return ""
    path = str(args.training_script)
    if not os.path.exists(path):
        return f"the script {path} does not exist. Fix: check the path (relative to {os.getcwd()})."
    if not os.path.isfile(path):
        return f"the script {path} is not a file. Fix: give the path of a Python script (or -m for a module)."
    if not os.access(path, os.R_OK):
        return f"the script {path} cannot be read (permission denied). Fix: `chmod +r {path}`."
    return ""


def run(args: argparse.Namespace, *, replace_process: bool = False) -> int:
    """Execute ``accelerando launch`` with parsed arguments.

    Args:
        args: from :func:`~accelerando.commands.launch.parser.build_parser`, plus ``unknown_args``:
            launcher-position flags we do not know (an error naming them and the closest known flags).
        replace_process: a one-process launch replaces this process by the script (see
            :func:`accelerando.launchers.runner.run`) and does not return; for the command line only.

    Returns:
        The exit status (the script's, or 2 for a configuration error, an unknown flag, a script
        that does not exist or cannot be read, or a command line or environment too large for the
        operating system to start: checked before any process starts).
    """
    error = _usage_error(args)
    if error:
        print(error, file=sys.stderr)
        return 2
    try:
        emitted = emit(args)
        if emitted is not None:
            return emitted
        settings, plan = plan_for(args)
    except (ValueError, KeyError) as err:
        print(f"accelerando launch: {err.args[0] if err.args else err}", file=sys.stderr)
        return 2
    if args.dry_run:
        print_dry_run(settings, plan)
        if settings.ray is not None:
            print(
                f"Ray: the {plan.num_processes} process(es) run as actors of the Ray cluster {settings.ray!r} "
                f"({settings.source('ray')}), each with the environment above plus its rank's variables"
            )
        return _describe_fault_tolerant(args, settings, plan)
    problem = script_problem(args, plan)
    if problem:
        print(f"accelerando launch: {problem}", file=sys.stderr)
        return 2
    try:
        check_files(settings)  # the files the processes read, only now: a plan may be made elsewhere
        check_exec_size(plan.argv, plan.env, names=_carried_settings(settings, plan.env))
    except ValueError as err:
        print(f"accelerando launch: {err}", file=sys.stderr)
        return 2
    if not args.quiet:
        for note in plan.notes:
            print(f"accelerando launch: {note}", file=sys.stderr)
    if settings.ray is not None:
        return _run_on_ray(settings, plan, args)
    return _run_plan(args, settings, plan, replace_process)


def _fault_tolerant_plan(args: argparse.Namespace, settings: Settings, plan: LaunchPlan) -> FaultTolerantPlan:
    """The replica groups of a ``--fault_tolerance`` launch (group 0 runs ``plan``; each has its own port).

    Raises:
        ValueError: the settings cannot run as replica groups (the message names the fix).
    """
    from accelerando.launchers.ft import build as build_fault_tolerant  # only --fault_tolerance

    return build_fault_tolerant(settings, plan, lambda: plan_for(args)[1])


def _describe_fault_tolerant(args: argparse.Namespace, settings: Settings, plan: LaunchPlan) -> int:
    """For ``--dry_run``: print the replica groups of a ``--fault_tolerance`` launch; the exit status."""
    if not settings.fault_tolerance:
        return 0
    try:
        print(_fault_tolerant_plan(args, settings, plan).describe())
    except ValueError as err:
        print(f"accelerando launch: {err}", file=sys.stderr)
        return 2
    return 0


def _run_plan(
    args: argparse.Namespace, settings: Settings, plan: LaunchPlan, replace_process: bool = False
) -> int:
    """Start the processes of ``plan``: one job, or one per replica group with ``--fault_tolerance``."""
    if settings.fault_tolerance:
        try:
            fault_tolerant = _fault_tolerant_plan(args, settings, plan)
        except ValueError as err:
            print(f"accelerando launch: {err}", file=sys.stderr)
            return 2
        from accelerando.launchers.ft import run as run_fault_tolerant  # only --fault_tolerance

        return run_fault_tolerant(fault_tolerant, quiet=args.quiet)

    return runner.run(plan, quiet=args.quiet, replace_process=replace_process)


def _run_on_ray(settings: Settings, plan: LaunchPlan, args: argparse.Namespace) -> int:
    """Run the plan's processes on the Ray cluster of ``--ray``; exit 2 when Ray is missing or unreachable."""
    from accelerando.launchers.ray import run_on_ray  # only --ray

    try:
        return run_on_ray(settings, plan, command_of(args), quiet=args.quiet)
    except ModuleNotFoundError as err:
        if err.name != "ray":
            raise
        print(
            f"accelerando launch: --ray ({settings.source('ray')}) needs Ray, which is not installed. "
            'Fix: pip install "accelerando[ray]".',
            file=sys.stderr,
        )
        return 2
    except ValueError as err:
        print(f"accelerando launch: {err}", file=sys.stderr)
        return 2
    except ConnectionError as err:
        print(
            f"accelerando launch: cannot reach the Ray cluster {settings.ray!r} ({settings.source('ray')}): "
            f"{err}. Fix: start it (`ray start --head`) or give its address (--ray HOST:PORT).",
            file=sys.stderr,
        )
        return 2


def _carried_settings(settings: Settings, env: Mapping[str, str]) -> dict[str, str]:
    """For each variable of ``env`` that carries a setting: ``"setting <name>, from <source>"``."""
    names: dict[str, str] = {}
    for field in FIELDS:
        for variable in (field.our_env, field.reference_env):
            if variable and variable in env:
                names[variable] = f"setting {field.name}, from {settings.source(field.name)}"
    return names


def main(argv: Sequence[str] | None = None, *, replace_process: bool | None = None) -> int:
    """Entry point of ``python -m accelerando.commands.launch`` and the ``accelerando-launch`` script.

    Args:
        argv: arguments (default: ``sys.argv[1:]``).
        replace_process: whether a one-process launch replaces this process by the script
            (:func:`os.execvp`: one interpreter start-up, the script's exit status and signals as
            its own) instead of waiting for it as a child; default: only when run as a program
            (``argv`` not given). A caller that continues after the launch passes ``argv``.

    Returns:
        The exit status (a launch that replaced this process does not return).
    """
    arguments = sys.argv[1:] if argv is None else list(argv)
    replace = argv is None if replace_process is None else replace_process
    return run(parse(parser_for(arguments), arguments), replace_process=replace)
