"""``accelerando launch [flags] script.py [script args]``: start a script in one or many processes.

Settings are resolved with defaults < config file < environment < CLI flags (the script's own code
wins over all of them, inside each process), then :func:`accelerando.launchers.plan.build` turns them
into a launch plan that :func:`accelerando.launchers.runner.run` executes. The flags are generated
from the settings table, so every setting with a flag appears here with its allowed values.

This module imports neither torch nor yaml at import time: ``--help`` and ``--dry-run`` stay fast.
Also runnable as ``python -m accelerando.commands.launch``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from accelerando.commands.spellings import (
    SpellingParser,
    add_dash_spellings,
    canonical_key,
    other_spelling,
)
from accelerando.settings.fields import FIELDS, Field

__all__ = ["add_parser", "build_parser", "run", "main", "resolve_launch_settings"]

_GROUP_TITLES = {
    "core": "Training",
    "launch": "Hardware and resources",
    "dynamo": "torch.compile (dynamo)",
    "fsdp": "FSDP (used with --use_fsdp)",
    "deepspeed": "DeepSpeed (used with --use_deepspeed)",
    "megatron": "Megatron-LM (used with --use_megatron_lm)",
}
# Reference flags with no setting of their own here: accepted, and passed to the script's environment
# under the reference's ACCELERATE_<NAME> so code written for it still finds them.
_COMPAT_VALUE_FLAGS = (
    "fp8_backend", "fp8_format", "fp8_margin", "fp8_interval", "fp8_amax_history_len",
    "fp8_amax_compute_algo", "fp8_override_linear_precision", "fp8_opt_level",
    "main_training_function",
)  # fmt: skip
_COMPAT_SWITCHES = ("use_xpu", "ipex", "tpu", "tpu_use_cluster", "fp8_use_autocast_during_eval")
_VALUE_OPTIONS_OWN = ("--config_file", "--role", "--tee", "--log_dir")


def _help(field: Field) -> str:
    text = field.help
    if field.choices:
        text += " Choices: " + ", ".join(field.choices) + "."
    if field.default is not None:
        text += f" Default: {field.default}."
    env = ", ".join(field.env_names)
    return f"{text} Env: {env}."


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    """Add every launch flag to ``parser`` (or a new one) and return it.

    Args:
        parser: an existing (sub)parser, or ``None`` to create ``accelerando launch``'s parser.

    Returns:
        The parser; each setting flag stores the raw string (or ``True`` for a switch) under the
        setting's name and defaults to ``None`` ("not given"). Every multi-word flag also takes its
        dash spelling (``--num-processes``); ``--help`` lists the underscore one.
    """
    if parser is None:
        parser = SpellingParser("accelerando launch", description=_DESCRIPTION)
    own = parser.add_argument_group("Launcher")
    own.add_argument(
        "--config_file", default=None, help="Config file to use (default: see `accelerando env`)."
    )
    own.add_argument("-m", "--module", action="store_true", help="Run the target as `python -m target`.")
    own.add_argument("--no_python", action="store_true", help="Run the target directly, not through Python.")
    own.add_argument("-q", "--quiet", action="store_true", help="Show only the script's own output.")
    own.add_argument("--dry-run", "--dry_run", dest="dry_run", action="store_true", help=_DRY_RUN_HELP)
    own.add_argument("--role", default=None, help="Elastic agent role name for the processes.")
    own.add_argument("--tee", default=None, help="Copy stdout/stderr to log files (0-3, or rank:value).")
    own.add_argument("--log_dir", default=None, help="Folder for the elastic agent's per-process logs.")
    groups: dict[str, Any] = {}
    for field in FIELDS:
        if field.cli is None:
            continue
        group = groups.get(field.group)
        if group is None:
            group = groups[field.group] = parser.add_argument_group(
                _GROUP_TITLES.get(field.group, field.group)
            )
        if field.switch:
            group.add_argument(
                field.cli, dest=field.name, action="store_const", const=True, help=_help(field)
            )
        else:
            group.add_argument(field.cli, dest=field.name, metavar=field.kind.upper(), help=_help(field))
    compat = parser.add_argument_group("Accepted for compatibility (passed to the script as ACCELERATE_*)")
    for name in _COMPAT_VALUE_FLAGS:
        compat.add_argument("--" + name, dest="compat_" + name, help=argparse.SUPPRESS)
    for name in _COMPAT_SWITCHES:
        compat.add_argument(
            "--" + name, dest="compat_" + name, action="store_const", const="true", help=argparse.SUPPRESS
        )
    parser.add_argument("training_script", nargs="?", help="The script, module or program to run.")
    parser.add_argument("training_script_args", nargs=argparse.REMAINDER, help="Its arguments, untouched.")
    return add_dash_spellings(parser)


_DESCRIPTION = (
    "Start a training script in one or many processes. Precedence of every setting: an argument in "
    "the script's code > a flag here > an environment variable > the config file > the default."
)
_DRY_RUN_HELP = "Print the resolved settings, topology, command and environment; start nothing."


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``accelerando launch`` on the CLI's subparsers.

    Args:
        subparsers: the object returned by ``ArgumentParser.add_subparsers()``.

    Returns:
        The new subparser.
    """
    parser = subparsers.add_parser("launch", help="Launch a script.", description=_DESCRIPTION)
    build_parser(parser)
    parser.set_defaults(func=run)
    return parser


def _cli_layer(args: argparse.Namespace) -> dict[str, Any]:
    from accelerando.settings.resolve import Sourced

    layer = {}
    for field in FIELDS:
        value = getattr(args, field.name, None) if field.cli else None
        if value is not None:
            layer[field.name] = Sourced(value, "cli:" + str(field.cli))
    return layer


def resolve_launch_settings(args: argparse.Namespace) -> tuple[Any, list[str]]:
    """Resolve the launcher's settings: defaults < config file < environment < CLI flags.

    Args:
        args: the parsed launch arguments.

    Returns:
        ``(settings, notes)``; notes are sentences for the user (e.g. which config file was used).

    Raises:
        ValueError: a bad config file (:class:`~accelerando.settings.configfile.ConfigError`) or a
            bad value from any layer; the message names the source and the fix.
    """
    from accelerando.settings.configfile import find_config_file, load_config_layer
    from accelerando.settings.resolve import env_layer, resolve

    path, note = find_config_file(args.config_file)
    notes = [note] if note else []
    config = load_config_layer(path) if path is not None else {}
    return resolve([config, env_layer(), _cli_layer(args)], warn_sources=()), notes


def _split_unknown(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """Split launcher tokens from the target: the first positional that is not an option value."""
    value_options = {f.cli for f in FIELDS if f.cli and not f.switch}
    value_options |= {"--" + n for n in _COMPAT_VALUE_FLAGS} | set(_VALUE_OPTIONS_OWN)
    value_options |= {other for option in value_options if (other := other_spelling(option))}
    i = 0
    while i < len(argv):
        token = argv[i]
        if not token.startswith("-"):
            break
        i += 2 if token in value_options else 1
    return list(argv[:i]), list(argv[i:])


def _compat_env(args: argparse.Namespace) -> dict[str, str]:
    env = {}
    for name in (*_COMPAT_VALUE_FLAGS, *_COMPAT_SWITCHES):
        value = getattr(args, "compat_" + name, None)
        if value is not None:
            env["ACCELERATE_" + name.upper()] = str(value)
    return env


def _print_settings(settings: Any) -> None:
    print("Settings (value, source) that differ from the defaults:")
    for name, value, source in settings.items():
        if source != "default":
            print(f"  {name} = {value!r}  [{source}]")


def _unknown_flags_message(flags: Sequence[str]) -> str:
    """The error for launcher-position flags the launcher does not know, with the likeliest meant ones."""
    import difflib

    # Matched spelling-independently (a dash typo finds the underscore flag); the listed spelling is shown.
    known: dict[str, str] = {}
    for action in build_parser()._actions:
        for option in action.option_strings:
            known.setdefault(canonical_key(option), option)
    named = []
    from accelerando.settings.fields import quote_value

    for flag in flags:
        close = difflib.get_close_matches(canonical_key(flag[:200]), list(known), n=1, cutoff=0.75)
        shown = flag if len(flag) <= 40 else quote_value(flag)
        named.append(f"{shown} (did you mean {known[close[0]]}?)" if close else shown)
    return (
        f"accelerando launch: unknown flag{'s' if len(flags) > 1 else ''} {', '.join(named)}. Launcher flags go "
        "before the script and the script's own flags after it: `accelerando launch [launcher flags] "
        "script.py [script flags]`; `accelerando launch --help` lists the launcher flags."
    )


def run(args: argparse.Namespace) -> int:
    """Execute ``accelerando launch`` with parsed arguments.

    Args:
        args: from :func:`build_parser`, plus ``unknown_args``: launcher-position flags we do not
            know (an error naming them and the closest known flags).

    Returns:
        The exit status (the script's, or 2 for a configuration error or an unknown flag).
    """
    from dataclasses import replace

    from accelerando.launchers.plan import Command, build, check_command
    from accelerando.settings.machine import detect_machine

    if not args.training_script:
        print(
            "accelerando launch: no script given. Fix: `accelerando launch [flags] script.py [args]`.",
            file=sys.stderr,
        )
        return 2
    extra = list(getattr(args, "unknown_args", []) or [])
    if extra:
        print(_unknown_flags_message(extra), file=sys.stderr)
        return 2
    try:
        settings, notes = resolve_launch_settings(args)
        command = Command(args.training_script, tuple(args.training_script_args), args.module, args.no_python)
        agent_options = [f"--{k}={getattr(args, k)}" for k in ("role", "tee", "log_dir") if getattr(args, k)]
        plan = build(settings, command, detect_machine(), agent_options=agent_options)
        check_command(command, settings)
    except (ValueError, KeyError) as err:
        print(f"accelerando launch: {err.args[0] if err.args else err}", file=sys.stderr)
        return 2
    plan = replace(plan, env={**plan.env, **_compat_env(args)}, notes=(*notes, *plan.notes))
    if args.dry_run:
        _print_settings(settings)
        print(plan.describe())
        return 0
    if not args.quiet:
        for note in plan.notes:
            print(f"accelerando launch: {note}", file=sys.stderr)
    from accelerando.launchers.runner import run as run_plan

    return run_plan(plan, quiet=args.quiet)


def parse(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.Namespace:
    """Parse launch arguments; unknown launcher flags are kept in ``unknown_args``.

    Args:
        parser: a parser made by :func:`build_parser`.
        argv: the arguments after ``launch``.

    Returns:
        The namespace.
    """
    head, tail = _split_unknown(argv)
    args, unknown = parser.parse_known_args(head)
    if tail:
        args.training_script, args.training_script_args = tail[0], tail[1:]
    args.unknown_args = unknown
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m accelerando.commands.launch``.

    Args:
        argv: arguments (default: ``sys.argv[1:]``).

    Returns:
        The exit status.
    """
    parser = build_parser()
    return run(parse(parser, sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
