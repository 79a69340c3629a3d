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
from accelerando.settings.fields import FIELDS, MACHINE_RANGE, Field

__all__ = [
    "CustomHelpFormatter",
    "DEEPSPEED_MULTINODE_LAUNCHERS",
    "DYNAMO_BACKENDS",
    "TORCH_DYNAMO_MODES",
    "add_parser",
    "build_parser",
    "clean_option",
    "default_config_file",
    "deepspeed_launcher",
    "launch_command",
    "launch_command_parser",
    "main",
    "multi_gpu_launcher",
    "resolve_launch_settings",
    "run",
    "sagemaker_launcher",
    "simple_launcher",
    "tpu_launcher",
    "tpu_pod_launcher",
]

#: The reference's lists (facts of its interface), for code that imports them from here.
DEEPSPEED_MULTINODE_LAUNCHERS = ["pdsh", "standard", "openmpi", "mvapich", "mpich", "nossh", "slurm"]
DYNAMO_BACKENDS = [
    "EAGER", "AOT_EAGER", "INDUCTOR", "AOT_TS_NVFUSER", "NVPRIMS_NVFUSER", "CUDAGRAPHS", "OFI", "FX2TRT",
    "ONNXRT", "TENSORRT", "AOT_TORCHXLA_TRACE_ONCE", "TORHCHXLA_TRACE_ONCE", "TVM",
]  # fmt: skip
TORCH_DYNAMO_MODES = ["default", "reduce-overhead", "max-autotune"]

_GROUP_TITLES = {
    "core": "Training",
    "launch": "Hardware and resources",
    "dynamo": "torch.compile (dynamo)",
    "fsdp": "FSDP (used with --use_fsdp)",
    "deepspeed": "DeepSpeed (used with --use_deepspeed)",
    "megatron": "Megatron-LM (used with --use_megatron_lm)",
    "parallelism": "N-d parallelism (ParallelismConfig; used with --use_fsdp or --use_deepspeed)",
    "fp8": "FP8 (used with --mixed_precision fp8)",
    "mpirun": "mpirun (multi-CPU jobs)",
    "emit": "Job files for cluster schedulers (--emit)",
}
# Reference flags with no setting of their own here: accepted, and passed to the script's environment
# under the reference's ACCELERATE_<NAME> so code written for it still finds them.
_COMPAT_VALUE_FLAGS = ("main_training_function",)
_COMPAT_SWITCHES = ("use_xpu", "ipex", "tpu", "tpu_use_cluster")
# Reference flags for places this launcher cannot start jobs in: refused with the reason when given.
_TPU_POD = "accelerando does not launch on TPU pods (that needs torch_xla and Google Cloud's gcloud)"
_SAGEMAKER = "accelerando does not launch Amazon SageMaker jobs (compute_environment must be LOCAL_MACHINE)"
_REFUSED_FLAGS: dict[str, tuple[bool, str]] = {  # flag -> (takes a value, why it is refused)
    "--tpu_cluster": (False, _TPU_POD),
    "--no_tpu_cluster": (False, _TPU_POD),
    "--tpu_use_sudo": (False, _TPU_POD),
    "--vm": (True, _TPU_POD),
    "--env": (True, _TPU_POD),
    "--aws_access_key_id": (True, _SAGEMAKER),
    "--aws_secret_access_key": (True, _SAGEMAKER),
}
_VALUE_OPTIONS_OWN = ("--config_file", "--role", "--tee", "-t", "--log_dir")
# Value names in --help for settings whose kind alone does not say what they take.
_METAVARS = {"num_machines": "N|MIN:MAX"}


def _help(field: Field) -> str:
    text = field.help
    if field.choices and field.choices is not MACHINE_RANGE:  # the range's spelling is in its help
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
        parser = SpellingParser(
            "accelerando launch", description=_DESCRIPTION, formatter_class=CustomHelpFormatter
        )
    own = parser.add_argument_group("Launcher")
    own.add_argument(
        "--config_file", default=None, help="Config file to use (default: see `accelerando env`)."
    )
    own.add_argument("-m", "--module", action="store_true", help="Run the target as `python -m target`.")
    own.add_argument("--no_python", action="store_true", help="Run the target directly, not through Python.")
    own.add_argument("-q", "--quiet", action="store_true", help="Show only the script's own output.")
    own.add_argument("--dry-run", "--dry_run", dest="dry_run", action="store_true", help=_DRY_RUN_HELP)
    own.add_argument("--role", default=None, help="Elastic agent role name for the processes.")
    own.add_argument(
        "-t", "--tee", default=None, help="Copy stdout/stderr to log files (0-3, or rank:value)."
    )
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
            metavar = _METAVARS.get(field.name, field.kind.upper())
            group.add_argument(field.cli, dest=field.name, metavar=metavar, help=_help(field))
    compat = parser.add_argument_group("Accepted for compatibility (passed to the script as ACCELERATE_*)")
    for name in _COMPAT_VALUE_FLAGS:
        compat.add_argument("--" + name, dest="compat_" + name, help=argparse.SUPPRESS)
    for name in _COMPAT_SWITCHES:
        compat.add_argument(
            "--" + name, dest="compat_" + name, action="store_const", const="true", help=argparse.SUPPRESS
        )
    for flag, (takes_value, _why) in _REFUSED_FLAGS.items():
        dest = "refused_" + flag[2:]
        if takes_value:
            compat.add_argument(flag, dest=dest, help=argparse.SUPPRESS)
        else:
            compat.add_argument(flag, dest=dest, action="store_const", const=True, help=argparse.SUPPRESS)
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
    parser = subparsers.add_parser(
        "launch", help="Launch a script.", description=_DESCRIPTION, formatter_class=CustomHelpFormatter
    )
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


def resolve_launch_settings(
    args: argparse.Namespace, forced: dict[str, Any] | None = None
) -> tuple[Any, list[str]]:
    """Resolve the launcher's settings: defaults < config file < environment < CLI flags.

    Args:
        args: the parsed launch arguments.
        forced: settings a named launcher implies (``deepspeed_launcher``: ``use_deepspeed``), on top.

    Returns:
        ``(settings, notes)``; notes are sentences for the user (e.g. which config file was used).

    Raises:
        ValueError: a bad config file (:class:`~accelerando.settings.configfile.ConfigError`) or a
            bad value from any layer; the message names the source and the fix.
    """
    from accelerando.settings.configfile import find_config_file, load_config_layer
    from accelerando.settings.resolve import Sourced, env_layer, resolve

    path, note = find_config_file(getattr(args, "config_file", None))
    notes = [note] if note else []
    config = load_config_layer(path) if path is not None else {}
    implied = {name: Sourced(value, "launcher") for name, value in (forced or {}).items()}
    return resolve([config, env_layer(), _cli_layer(args), implied], warn_sources=()), notes


def _split_unknown(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """Split launcher tokens from the target: the first positional that is not an option value."""
    value_options = {f.cli for f in FIELDS if f.cli and not f.switch}
    value_options |= {"--" + n for n in _COMPAT_VALUE_FLAGS} | set(_VALUE_OPTIONS_OWN)
    value_options |= {flag for flag, (takes_value, _why) in _REFUSED_FLAGS.items() if takes_value}
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


def _refused_message(args: argparse.Namespace) -> str:
    """The error for reference flags naming a place this launcher cannot start jobs in, or ``""``."""
    given = [flag for flag in _REFUSED_FLAGS if getattr(args, "refused_" + flag[2:], None) is not None]
    if not given:
        return ""
    reasons = dict.fromkeys(_REFUSED_FLAGS[flag][1] for flag in given)
    return (
        f"accelerando launch: {', '.join(given)} cannot be used: {'; '.join(reasons)}. Fix: drop "
        f"{'it' if len(given) == 1 else 'them'} and launch on this machine's CPUs/GPUs (or a cluster's, with "
        "--num_machines / --mpirun_hostfile)."
    )


def run(args: argparse.Namespace) -> int:
    """Execute ``accelerando launch`` with parsed arguments.

    Args:
        args: from :func:`build_parser`, plus ``unknown_args``: launcher-position flags we do not
            know (an error naming them and the closest known flags).

    Returns:
        The exit status (the script's, or 2 for a configuration error or an unknown flag).
    """
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
    refused = _refused_message(args)
    if refused:
        print(refused, file=sys.stderr)
        return 2
    try:
        emitted = _emit(args)
        if emitted is not None:
            return emitted
        settings, plan = _plan_for(args)
    except (ValueError, KeyError) as err:
        print(f"accelerando launch: {err.args[0] if err.args else err}", file=sys.stderr)
        return 2
    if args.dry_run:
        _print_settings(settings)
        print(plan.describe())
        return 0
    if not args.quiet:
        for note in plan.notes:
            print(f"accelerando launch: {note}", file=sys.stderr)
    from accelerando.launchers.runner import run as run_plan

    return run_plan(plan, quiet=args.quiet)


def _command_of(args: argparse.Namespace) -> Any:
    """The :class:`~accelerando.launchers.plan.Command` each process of ``args`` runs."""
    from accelerando.launchers.plan import Command

    return Command(
        args.training_script,
        tuple(getattr(args, "training_script_args", None) or ()),
        bool(getattr(args, "module", False)),
        bool(getattr(args, "no_python", False)),
    )


def _emit(args: argparse.Namespace) -> int | None:
    """With ``--emit``, write the job for a scheduler instead of launching; ``None`` without it.

    Raises ValueError for impossible settings or a file that cannot be written (the message says why).
    """
    settings, _notes = resolve_launch_settings(args)
    if not settings.emit:
        return None
    from accelerando.launchers.emit import emit_job, write_job

    text = emit_job(settings, _command_of(args))
    try:
        shown = write_job(text, settings.emit_to)
    except OSError as err:
        raise ValueError(
            f"cannot write the job to {settings.emit_to!r} (--emit_to): {err.strerror}. Fix: give a writable path."
        ) from None
    if settings.emit_to:
        if not args.quiet:
            print(f"accelerando launch: {shown}", file=sys.stderr)
    else:
        sys.stdout.write(shown)
    return 0


def _plan_for(args: argparse.Namespace, forced: dict[str, Any] | None = None) -> tuple[Any, Any]:
    """Resolve the settings of ``args`` and plan the launch: ``(settings, plan)``; raises ValueError/KeyError."""
    from dataclasses import replace

    from accelerando.launchers.plan import build, check_command
    from accelerando.settings.machine import detect_machine

    settings, notes = resolve_launch_settings(args, forced)
    command = _command_of(args)
    agent_options = [
        f"--{k}={getattr(args, k)}" for k in ("role", "tee", "log_dir") if getattr(args, k, None)
    ]
    plan = build(settings, command, detect_machine(), agent_options=agent_options)
    check_command(command, settings)
    return settings, replace(plan, env={**plan.env, **_compat_env(args)}, notes=(*notes, *plan.notes))


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


# --- the reference's module interface, over the same settings, plan and runner ----------------------


class CustomHelpFormatter(argparse.HelpFormatter):
    """``--help`` text that lists each flag once and leaves out flags kept only for compatibility.

    A flag registered under both spellings shows its underscore one; a flag whose help is
    ``argparse.SUPPRESS`` is not listed; a section left without any flag is not printed.
    """

    def add_argument(self, action: argparse.Action) -> None:
        """Add ``action`` to the help, under one spelling, unless its help is suppressed."""
        if action.help is argparse.SUPPRESS:
            return
        names = action.option_strings
        shown = [o for o in names if not (o.startswith("--") and "-" in o[2:] and other_spelling(o) in names)]
        if shown != names:
            import copy

            action = copy.copy(action)
            action.option_strings = shown
        super().add_argument(action)

    def end_section(self) -> None:
        """Close the current section; one that holds no flag is dropped with its heading."""
        section = self._current_section
        super().end_section()
        parent = self._current_section
        if not section.items and parent.items and parent.items[-1][1] == (section,):
            parent.items.pop()


def clean_option(option: str) -> str:
    """Spell a long option with underscores after its leading dashes (``--num-processes`` -> ``--num_processes``).

    Args:
        option: an option as typed; a short option or a plain word is returned unchanged.

    Returns:
        The option in its underscore spelling.
    """
    return "--" + option[2:].replace("-", "_") if option.startswith("--") else option


def _default_config_file() -> str:
    from accelerando.settings.configfile import default_config_path

    return str(default_config_path())


#: Where the config file is read from when --config_file is not given (it may not exist).
default_config_file = _default_config_file()


def launch_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """The parser of ``launch``: standalone, or registered on a CLI's ``subparsers``.

    Args:
        subparsers: the object returned by ``ArgumentParser.add_subparsers()``, or None for a
            standalone parser.

    Returns:
        The parser; its ``func`` default is :func:`launch_command`.
    """
    if subparsers is None:
        parser = build_parser()
    else:
        parser = subparsers.add_parser("launch", help="Launch a script.", description=_DESCRIPTION)
        build_parser(parser)
    parser.set_defaults(func=launch_command)
    return parser


def _validate_launch_command(args: argparse.Namespace) -> tuple[argparse.Namespace, Any, bool]:
    """Resolve and check the settings of a launch namespace without starting anything.

    Args:
        args: a namespace from :func:`launch_command_parser`.

    Returns:
        ``(args, settings, mixed_precision_from_config)``: the same namespace, the resolved
        :class:`~accelerando.settings.Settings` (defaults < config file < environment < flags), and
        whether the mixed precision came from the config file.

    Raises:
        ValueError: an unknown or refused flag, a bad config file or value, or an impossible
            combination (the message names the setting, where it came from and the fix).
    """
    extra = list(getattr(args, "unknown_args", None) or [])
    if extra:
        raise ValueError(_unknown_flags_message(extra))
    refused = _refused_message(args)
    if refused:
        raise ValueError(refused)
    settings, _plan = _plan_for(args)
    return args, settings, settings.source("mixed_precision").startswith("config:")


def _start(
    args: argparse.Namespace, allowed: tuple[str, ...], who: str, forced: dict[str, Any] | None = None
) -> None:
    """Plan ``args``, check the plan is one ``who`` starts, run it; a failure raises as the reference does."""
    _validate_launch_command(args)
    _settings, plan = _plan_for(args, forced)
    if plan.mode not in allowed:
        raise ValueError(
            f"{who} starts {' or '.join(allowed)} launches, but these settings make a {plan.mode} launch of "
            f"{plan.num_processes} process(es). Fix: call launch_command(args), which picks the launcher."
        )
    from accelerando.launchers.runner import run as run_plan

    quiet = bool(getattr(args, "quiet", False))
    code = run_plan(plan, quiet=quiet)
    if code:
        if plan.mode == "simple" and not quiet:
            import subprocess

            raise subprocess.CalledProcessError(code, list(plan.argv))
        raise SystemExit(code)


def simple_launcher(args: argparse.Namespace) -> None:
    """Start the script in one process on this machine (or, with ``mpirun_hostfile``, through mpirun).

    Args:
        args: a namespace from :func:`launch_command_parser`.

    Raises:
        subprocess.CalledProcessError: the process failed (with ``quiet``: SystemExit with its status).
        ValueError: the settings ask for something else (several processes without mpirun, ...).
    """
    _start(args, ("simple", "mpirun"), "simple_launcher")


def multi_gpu_launcher(args: argparse.Namespace) -> None:
    """Start the processes of a multi-process job through ``torch.distributed.run`` (GPUs or ``--cpu``).

    Args:
        args: a namespace from :func:`launch_command_parser`.

    Raises:
        SystemExit: a process failed (the status of the first that failed).
        ValueError: the settings make a one-process, mpirun or DeepSpeed-runner launch.
    """
    _start(args, ("elastic",), "multi_gpu_launcher")


def deepspeed_launcher(args: argparse.Namespace) -> None:
    """Start a DeepSpeed job: ``torch.distributed.run`` on each machine, or DeepSpeed's multi-machine runner.

    ``use_deepspeed`` is implied.

    Args:
        args: a namespace from :func:`launch_command_parser`.

    Raises:
        SystemExit: a process failed.
        ValueError: impossible settings (the message names them and the fix).
    """
    _start(args, ("simple", "elastic", "deepspeed"), "deepspeed_launcher", {"use_deepspeed": True})


def tpu_launcher(args: argparse.Namespace) -> None:
    """Run the script's main function in ``num_processes`` TPU processes through torch_xla.

    The script is imported as a module and ``main_training_function`` (``--main_training_function``,
    default ``main``) is started by ``torch_xla.distributed.xla_multiprocessing.spawn``.

    Args:
        args: a namespace from :func:`launch_command_parser`.

    Raises:
        RuntimeError: torch_xla is not installed (TPUs need a TPU VM with torch_xla).
        ValueError: the script has no such function.
    """
    import importlib.util

    if importlib.util.find_spec("torch_xla") is None:
        raise RuntimeError(
            "tpu_launcher runs on TPUs through torch_xla, which is not installed. Fix: run on a TPU VM with "
            "torch_xla installed, or launch on CPUs/GPUs with launch_command."
        )
    import torch_xla.distributed.xla_multiprocessing as xmp  # type: ignore[import-not-found]

    from accelerando.utils.environment import patch_environment
    from accelerando.utils.launch import PrepareForLaunch

    settings, plan = _plan_for(args)
    name = getattr(args, "main_training_function", None) or settings.main_training_function
    script = str(args.training_script)
    spec = importlib.util.spec_from_file_location("__accelerando_tpu_main__", script)
    if spec is None or spec.loader is None:
        raise ValueError(f"tpu_launcher cannot import {script!r}. Fix: pass a Python script.")
    module = importlib.util.module_from_spec(spec)
    sys.argv = [script, *(getattr(args, "training_script_args", None) or [])]
    spec.loader.exec_module(module)
    function = getattr(module, name, None)
    if not callable(function):
        raise ValueError(f"{script} has no function {name!r}. Fix: pass --main_training_function.")
    with patch_environment(**plan.env):
        xmp.spawn(PrepareForLaunch(function), args=(), nprocs=settings.num_processes)


def tpu_pod_launcher(args: argparse.Namespace) -> None:
    """Refuse a TPU-pod launch: starting every worker of a pod needs Google Cloud's gcloud and torch_xla.

    Args:
        args: a namespace from :func:`launch_command_parser`.

    Raises:
        RuntimeError: always; the message says how to run on a pod instead.
    """
    raise RuntimeError(
        f"tpu_pod_launcher: {_TPU_POD}. Fix: run `accelerando launch` on every worker of the pod yourself "
        "(e.g. `gcloud compute tpus tpu-vm ssh NAME --worker=all --command=...`)."
    )


def sagemaker_launcher(sagemaker_config: Any, args: argparse.Namespace) -> None:
    """Refuse a SageMaker launch: accelerando starts jobs on this machine or a cluster of its own.

    Args:
        sagemaker_config: the SageMaker part of a config file.
        args: a namespace from :func:`launch_command_parser`.

    Raises:
        RuntimeError: always; the message says what to do instead.
    """
    raise RuntimeError(
        f"sagemaker_launcher: {_SAGEMAKER}. Fix: run `accelerando launch` inside the SageMaker training job's "
        "own entry point, with a LOCAL_MACHINE config."
    )


def launch_command(args: argparse.Namespace) -> None:
    """Start the launch ``args`` describe, as ``accelerando launch`` does (it picks the launcher).

    Args:
        args: a namespace from :func:`launch_command_parser` (``parser.parse_args(argv)``).

    Raises:
        SystemExit: with the exit status, when it is not 0 (a failed process, or 2 for a usage or
            configuration error, which is printed).
    """
    code = run(args)
    if code:
        raise SystemExit(code)


if __name__ == "__main__":
    sys.exit(main())
