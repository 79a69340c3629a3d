"""The argument parser of ``accelerando launch``, generated from the settings table.

:func:`build_parser` adds the launcher's own options, one flag per setting that has one (grouped by
the setting's group, with its choices, default and variables in the help), and the reference's
compatibility flags (hidden from ``--help``). :func:`parse` splits the launcher's flags from the target
before parsing, so the script's own flags are never taken for the launcher's.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Collection, Sequence

from accelerando.commands.launch.flags import (
    COMPAT_SWITCHES,
    COMPAT_VALUE_FLAGS,
    REFUSED_FLAGS,
    split_unknown,
)
from accelerando.commands.spellings import (
    SPELLING_NOTE,
    SpellingParser,
    add_dash_spellings,
    canonical_key,
    other_spelling,
)
from accelerando.core.settings.fields import FIELDS, Field, quote_value

__all__ = [
    "DESCRIPTION",
    "USAGE",
    "CustomHelpFormatter",
    "ParserDefault",
    "build_parser",
    "is_given",
    "parser_for",
    "parse",
    "unknown_flags_message",
]

#: The description of ``accelerando launch`` in ``--help``.
DESCRIPTION = (
    "Start a training script in one or many processes. Precedence of every setting: an argument in "
    "the script's code > a flag here > an environment variable > the config file > the default."
)
#: The short synopsis ``--help`` and usage errors open with (every flag is listed below it).
USAGE = """accelerando launch [options] script.py [script args]
       accelerando launch [options] -m module [module args]

most-used options: --num_processes N, --multi_gpu, --cpu, --mixed_precision {no,bf16,fp16,fp8},
  --config_file FILE, --num_machines N, --use_fsdp, --use_deepspeed, --dry_run"""
#: The last lines of ``--help``: the second spelling of every flag, once.
EPILOG = f"{SPELLING_NOTE} E.g. --num-processes is --num_processes."
_DRY_RUN_HELP = "Print the resolved settings, topology, command and environment; start nothing."
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
    "fault_tolerance": "Fault tolerance (torchft; used with --fault_tolerance)",
    "ray": "Ray cluster (--ray)",
}
# Value names in --help for settings whose kind alone does not say what they take.
_METAVARS = {"num_machines": "N|MIN:MAX", "ray": "ADDRESS"}
# Flags whose value may be left out, with the value they then take (see flags.split_unknown).
_OPTIONAL_VALUES = {"ray": "default"}
# Whether a flag (given by its option string) goes into the parser being built.
_Wanted = Callable[[str], bool]


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


def _help(field: Field) -> str:
    text = field.help
    if field.choices:
        text += " Choices: " + ", ".join(field.choices) + "."
    if field.default is not None:
        text += f" Default: {field.default}."
    env = ", ".join(field.env_names)
    return f"{text} Env: {env}."


class ParserDefault(str):
    """A flag's value when it was not given, where code reads the flag before the settings resolve.

    It reads as the reference's parser default (``"true"``) but is not taken for a given flag: the
    config file and the environment still set the setting (see :func:`is_given`).
    """

    __slots__ = ()


# The reference parser's defaults that code written for it reads straight from the namespace.
_PARSER_DEFAULTS = {"fsdp_sync_module_states": ParserDefault("true")}


def is_given(field: Field, value: object) -> bool:
    """Whether ``value``, read from a launch namespace for ``field``, was given on the command line.

    Args:
        field: the setting's row.
        value: the namespace's value for it.

    Returns:
        False for ``None``, an absent switch (``False``) and a :class:`ParserDefault`; True otherwise.
    """
    if value is None or isinstance(value, ParserDefault):
        return False
    return not (field.switch and value is False)


def _as_given(text: str) -> str:
    # What argparse does without a ``type`` (its registry's identity): a default object stays itself.
    return text


def _typed(field: Field) -> Callable[[str], int | float | str]:
    """The argparse ``type`` of a setting flag: a number as a number, anything else as typed.

    Text that is not a number stays text, so the settings resolver reports it with the setting, the
    flag and the fix (argparse's own message would say less).
    """
    if field.kind not in ("int", "float"):
        return _as_given
    kind = int if field.kind == "int" else float

    def convert(text: str) -> int | float | str:
        try:
            return kind(text)
        except ValueError:
            return text

    convert.__name__ = field.kind
    return convert


def _add_own_options(parser: argparse.ArgumentParser) -> None:
    own = parser.add_argument_group("Launcher")
    own.add_argument(
        "--config_file", default=None, help="Config file to use (default: see `accelerando env`)."
    )
    own.add_argument("-m", "--module", action="store_true", help="Run the target as `python -m target`.")
    own.add_argument("--no_python", action="store_true", help="Run the target directly, not through Python.")
    own.add_argument("-q", "--quiet", action="store_true", help="Show only the script's own output.")
    own.add_argument("--dry_run", action="store_true", help=_DRY_RUN_HELP)
    own.add_argument("--role", default=None, help="Elastic agent role name for the processes.")
    own.add_argument(
        "-t", "--tee", default=None, help="Copy stdout/stderr to log files (0-3, or rank:value)."
    )
    own.add_argument("--log_dir", default=None, help="Folder for the elastic agent's per-process logs.")


def _add_setting_flags(parser: argparse.ArgumentParser, wanted: _Wanted) -> dict[str, object]:
    """Add the setting flags ``wanted`` admits; return the namespace defaults of those left out."""
    groups: dict[str, argparse._ArgumentGroup] = {}
    left_out: dict[str, object] = {}
    for field in FIELDS:
        if field.cli is None:
            continue
        if not wanted(field.cli):
            left_out[field.name] = False if field.switch else _PARSER_DEFAULTS.get(field.name)
            continue
        group = groups.get(field.group)
        if group is None:
            group = groups[field.group] = parser.add_argument_group(
                _GROUP_TITLES.get(field.group, field.group)
            )
        if field.switch:
            group.add_argument(field.cli, dest=field.name, action="store_true", help=_help(field))
        else:
            metavar = _METAVARS.get(field.name, field.kind.upper())
            # A flag with an optional value takes that value when given bare (nargs=None, const=None
            # are argparse's defaults for the others).
            group.add_argument(
                field.cli,
                dest=field.name,
                metavar=metavar,
                type=_typed(field),
                default=_PARSER_DEFAULTS.get(field.name),
                help=_help(field),
                nargs="?" if field.name in _OPTIONAL_VALUES else None,
                const=_OPTIONAL_VALUES.get(field.name),
            )
    return left_out


def _add_compat_flags(parser: argparse.ArgumentParser, wanted: _Wanted) -> dict[str, object]:
    """Add the compatibility flags ``wanted`` admits; return the namespace defaults of those left out."""
    compat = parser.add_argument_group("Accepted for compatibility (passed to the script as ACCELERATE_*)")
    left_out: dict[str, object] = {}
    for name in COMPAT_VALUE_FLAGS:
        if not wanted("--" + name):
            left_out["compat_" + name] = None
            continue
        compat.add_argument("--" + name, dest="compat_" + name, help=argparse.SUPPRESS)
    for name in COMPAT_SWITCHES:
        if not wanted("--" + name):
            left_out["compat_" + name] = None
            continue
        compat.add_argument(
            "--" + name, dest="compat_" + name, action="store_const", const="true", help=argparse.SUPPRESS
        )
    for flag, (takes_value, _why) in REFUSED_FLAGS.items():
        dest = "refused_" + flag[2:]
        if not wanted(flag):
            left_out[dest] = None
            continue
        if takes_value:
            compat.add_argument(flag, dest=dest, help=argparse.SUPPRESS)
        else:
            compat.add_argument(flag, dest=dest, action="store_const", const=True, help=argparse.SUPPRESS)
    return left_out


def _every_flag(option: str) -> bool:
    return True


def _naming_any_of(prefixes: Collection[str]) -> _Wanted:
    """Admits a long option that one of ``prefixes`` names exactly or abbreviates, in either spelling."""

    def wanted(option: str) -> bool:
        other = other_spelling(option) or option
        return any(option.startswith(prefix) or other.startswith(prefix) for prefix in prefixes)

    return wanted


def _long_option_prefixes(argv: Sequence[str]) -> list[str] | None:
    """The long-option names typed in the launcher's part of ``argv`` (before any ``=``).

    ``None`` when a token may ask for ``--help`` (its text lists every flag): a prefix of ``--help``,
    or a short-option token holding an ``h`` (``-h``, ``-qh``).
    """
    head, _target = split_unknown(argv)
    prefixes = []
    for token in head:
        if token == "--" or not token.startswith("-"):
            continue
        if not token.startswith("--"):
            if "h" in token:
                return None
            continue  # a short option: only the launcher's own have one, and those are always added
        name = token.split("=", 1)[0]
        if "--help".startswith(name):
            return None
        prefixes.append(name)
    return prefixes


def parser_for(argv: Sequence[str]) -> argparse.ArgumentParser:
    """A launch parser that holds only the flags ``argv`` can name: it parses ``argv`` as :func:`build_parser`'s would.

    A setting or compatibility flag is added when a long option typed before the script names it
    exactly or abbreviates it (either spelling), so argparse sees the same candidates, and reports
    the same ambiguities, as with every flag; the flags left out get their usual value in the
    namespace. Building all ~150 flags with their help texts was a tenth of a one-process launch's
    instructions before the script starts. ``--help`` (or anything that may abbreviate it) gets the
    full parser.

    Args:
        argv: the arguments after ``launch``.

    Returns:
        The parser, for :func:`parse` with the same ``argv``.
    """
    prefixes = _long_option_prefixes(argv)
    return build_parser() if prefixes is None else build_parser(_wanted=_naming_any_of(prefixes))


def build_parser(
    parser: argparse.ArgumentParser | None = None, *, _wanted: _Wanted = _every_flag
) -> argparse.ArgumentParser:
    """Add every launch flag to ``parser`` (or a new one) and return it.

    Args:
        parser: an existing (sub)parser, or ``None`` to create ``accelerando launch``'s parser.

    Returns:
        The parser; each setting flag stores its value under the setting's name (a number as a
        number, other values as typed; a switch ``True``), and ``None`` (a switch: ``False``) when not
        given (:func:`is_given`). Every multi-word flag also takes its dash spelling
        (``--num-processes``); ``--help`` lists the underscore one and opens with :data:`USAGE`.
    """
    if parser is None:
        parser = SpellingParser("accelerando launch", formatter_class=CustomHelpFormatter)
    parser.usage, parser.description, parser.epilog = USAGE, DESCRIPTION, EPILOG
    _add_own_options(parser)
    left_out = _add_setting_flags(parser, _wanted)
    left_out.update(_add_compat_flags(parser, _wanted))
    if left_out:
        parser.set_defaults(**left_out)
    parser.add_argument("training_script", nargs="?", help="The script, module or program to run.")
    parser.add_argument("training_script_args", nargs=argparse.REMAINDER, help="Its arguments, untouched.")
    return add_dash_spellings(parser)


def parse(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.Namespace:
    """Parse launch arguments; unknown launcher flags are kept in ``unknown_args``.

    Args:
        parser: a parser made by :func:`build_parser`.
        argv: the arguments after ``launch``.

    Returns:
        The namespace.
    """
    head, tail = split_unknown(argv)
    args, unknown = parser.parse_known_args(head)
    if tail:
        args.training_script, args.training_script_args = tail[0], tail[1:]
    args.unknown_args = unknown
    return args


def unknown_flags_message(flags: Sequence[str]) -> str:
    """The error for launcher-position flags the launcher does not know, with the likeliest meant ones.

    Args:
        flags: the unknown flags, as typed.

    Returns:
        One message naming each flag (with ``did you mean`` where a known flag is close) and the fix.
    """
    import difflib

    # Matched spelling-independently (a dash typo finds the underscore flag); the listed spelling is shown.
    known: dict[str, str] = {}
    for action in build_parser()._actions:
        for option in action.option_strings:
            known.setdefault(canonical_key(option), option)
    named = []
    for flag in flags:
        close = difflib.get_close_matches(canonical_key(flag[:200]), list(known), n=1, cutoff=0.75)
        shown = flag if len(flag) <= 40 else quote_value(flag)
        named.append(f"{shown} (did you mean {known[close[0]]}?)" if close else shown)
    return (
        f"accelerando launch: unknown flag{'s' if len(flags) > 1 else ''} {', '.join(named)}. Launcher flags go "
        "before the script and the script's own flags after it: `accelerando launch [launcher flags] "
        "script.py [script flags]`; `accelerando launch --help` lists the launcher flags."
    )
