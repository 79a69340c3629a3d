"""The flags of ``accelerando launch`` that have no setting of their own, and their spelling.

The setting flags come from the settings table (:mod:`accelerando.core.settings.fields`); this module holds
the rest: the launcher's own value options, the reference's flags accepted for compatibility (passed to
the script as ``ACCELERATE_<NAME>``), and the reference's flags refused with a reason. It also finds
where the launcher's flags end and the target begins (:func:`split_unknown`). Pure: no I/O, no torch.
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Sequence

from accelerando.commands.spellings import other_spelling
from accelerando.core.settings.fields import FIELDS

__all__ = [
    "COMPAT_SWITCHES",
    "COMPAT_VALUE_FLAGS",
    "REFUSED_FLAGS",
    "SAGEMAKER",
    "SWITCHES_OWN",
    "TPU_POD",
    "VALUE_OPTIONS_OWN",
    "clean_option",
    "compat_env",
    "refused_message",
    "split_unknown",
]

#: Reference flags with no setting of their own here, taking a value: accepted, and passed to the
#: script's environment under the reference's ``ACCELERATE_<NAME>`` so code written for it finds them.
COMPAT_VALUE_FLAGS = ("main_training_function",)
#: The same, for switches (passed as ``"true"``).
COMPAT_SWITCHES = ("use_xpu", "ipex", "tpu", "tpu_use_cluster")
#: Why a TPU-pod launch is refused.
TPU_POD = "accelerando does not launch on TPU pods (that needs torch_xla and Google Cloud's gcloud)"
#: Why a SageMaker launch is refused.
SAGEMAKER = "accelerando does not launch Amazon SageMaker jobs (compute_environment must be LOCAL_MACHINE)"
#: Reference flags for places this launcher cannot start jobs in: flag -> (takes a value, why refused).
REFUSED_FLAGS: dict[str, tuple[bool, str]] = {
    "--tpu_cluster": (False, TPU_POD),
    "--no_tpu_cluster": (False, TPU_POD),
    "--tpu_use_sudo": (False, TPU_POD),
    "--vm": (True, TPU_POD),
    "--env": (True, TPU_POD),
    "--aws_access_key_id": (True, SAGEMAKER),
    "--aws_secret_access_key": (True, SAGEMAKER),
}
#: The launcher's own options that take a value (see :func:`accelerando.commands.launch.parser.build_parser`).
VALUE_OPTIONS_OWN = ("--config_file", "--role", "--tee", "-t", "--log_dir")


def clean_option(option: str) -> str:
    """Spell a long option with underscores after its leading dashes (``--num-processes`` -> ``--num_processes``).

    Args:
        option: an option as typed; a short option or a plain word is returned unchanged.

    Returns:
        The option in its underscore spelling.
    """
    return "--" + option[2:].replace("-", "_") if option.startswith("--") else option


#: The launcher's own switches (see :func:`accelerando.commands.launch.parser.build_parser`; ``-h`` is argparse's).
SWITCHES_OWN = ("-m", "--module", "--no_python", "-q", "--quiet", "--dry_run", "-h", "--help")


@functools.cache  # a launch splits its arguments twice (to narrow the parser, then to parse)
def _launcher_options() -> tuple[frozenset[str], frozenset[str]]:
    """Every launcher option that takes a value, and every switch, in both spellings."""
    values = {f.cli for f in FIELDS if f.cli and not f.switch}
    values |= {"--" + n for n in COMPAT_VALUE_FLAGS} | set(VALUE_OPTIONS_OWN)
    values |= {flag for flag, (takes_value, _why) in REFUSED_FLAGS.items() if takes_value}
    switches = {f.cli for f in FIELDS if f.cli and f.switch}
    switches |= {"--" + n for n in COMPAT_SWITCHES} | set(SWITCHES_OWN)
    switches |= {flag for flag, (takes_value, _why) in REFUSED_FLAGS.items() if not takes_value}
    for options in (values, switches):
        options |= {other for option in options if (other := other_spelling(option))}
    return frozenset(values), frozenset(switches)


def split_unknown(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """Split launcher tokens from the target: the first positional that is not an option value.

    An option may be abbreviated, as argparse allows (``--num_proc 2``): a token that is the start of
    options that all take a value takes the next word as its value.

    Args:
        argv: the arguments after ``launch``.

    Returns:
        ``(launcher tokens, [target, *target args])``; either may be empty.
    """
    value_options, switches = _launcher_options()
    i = 0
    while i < len(argv):
        token = argv[i]
        if not token.startswith("-"):
            break
        named = _named_options(token, value_options, switches)
        if named == {"--ray"}:  # its value may be left out: `--ray script.py` runs script.py
            i += 2 if i + 1 < len(argv) and is_ray_address(argv[i + 1]) else 1
            continue
        i += 2 if named and named <= value_options else 1
    return list(argv[:i]), list(argv[i:])


def _named_options(token: str, value_options: frozenset[str], switches: frozenset[str]) -> set[str]:
    """The options ``token`` names: itself when it is one, else those it abbreviates (none with ``=``)."""
    if "=" in token or token == "--":
        return set()
    if token in value_options or token in switches:
        return {token}
    if not token.startswith("--"):
        return set()
    return {option for option in (*value_options, *switches) if option.startswith(token)}


def is_ray_address(token: str) -> bool:
    """Whether ``token``, after ``--ray``, is the cluster's address rather than the script.

    Args:
        token: the word after ``--ray``.

    Returns:
        True for ``auto``, ``local``, ``default`` and anything with a colon (``host:port``, ``ray://host:port``).
    """
    return token in ("auto", "local", "default") or ":" in token


def compat_env(args: argparse.Namespace) -> dict[str, str]:
    """The ``ACCELERATE_<NAME>`` variables of the compatibility flags given in ``args``.

    Args:
        args: the parsed launch arguments.

    Returns:
        Variable name -> value, for each compatibility flag that was given.
    """
    env = {}
    for name in (*COMPAT_VALUE_FLAGS, *COMPAT_SWITCHES):
        value = getattr(args, "compat_" + name, None)
        if value is not None:
            env["ACCELERATE_" + name.upper()] = str(value)
    return env


def refused_message(args: argparse.Namespace) -> str:
    """The error for reference flags naming a place this launcher cannot start jobs in, or ``""``.

    Args:
        args: the parsed launch arguments.

    Returns:
        One message naming every refused flag given, why, and the fix; ``""`` when none was given.
    """
    given = [flag for flag in REFUSED_FLAGS if getattr(args, "refused_" + flag[2:], None) is not None]
    if not given:
        return ""
    reasons = dict.fromkeys(REFUSED_FLAGS[flag][1] for flag in given)
    return (
        f"accelerando launch: {', '.join(given)} cannot be used: {'; '.join(reasons)}. Fix: drop "
        f"{'it' if len(given) == 1 else 'them'} and launch on this machine's CPUs/GPUs (or a cluster's, with "
        "--num_machines / --mpirun_hostfile)."
    )
