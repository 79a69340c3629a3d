"""``accelerando launch [flags] script.py [script args]``: start a script in one or many processes.

Settings are resolved with defaults < config file < environment < CLI flags (the script's own code
wins over all of them, inside each process), then :func:`accelerando.launchers.plan.build` turns them
into a launch plan that :func:`accelerando.launchers.runner.run` executes. The flags are generated
from the settings table, so every setting with a flag appears here with its allowed values.

One module per responsibility:

- :mod:`.flags`: the flags that are not settings (own, compatibility, refused) and their spelling;
- :mod:`.parser`: the argument parser, its ``--help`` formatting, and parsing;
- :mod:`.resolution`: parsed arguments -> resolved settings -> launch plan;
- :mod:`.dry_run` and :mod:`.emit`: ``--dry_run`` printing and ``--emit`` job files;
- :mod:`.entry`: :func:`run`, :func:`main` and the CLI registration;
- :mod:`.reference`: the reference's module interface (``launch_command`` and the named launchers).

No module here imports torch or yaml at import time: ``--help`` and ``--dry_run`` stay fast.
Also runnable as ``python -m accelerando.commands.launch``.
"""

from __future__ import annotations

from accelerando.commands.launch import reference
from accelerando.commands.launch.entry import add_parser, main, run
from accelerando.commands.launch.flags import clean_option
from accelerando.commands.launch.parser import CustomHelpFormatter, build_parser, parse
from accelerando.commands.launch.reference import (
    DEEPSPEED_MULTINODE_LAUNCHERS,
    DYNAMO_BACKENDS,
    TORCH_DYNAMO_MODES,
    deepspeed_launcher,
    launch_command,
    launch_command_parser,
    multi_gpu_launcher,
    sagemaker_launcher,
    simple_launcher,
    tpu_launcher,
    tpu_pod_launcher,
)

# The private names of the former single module, still reached by tests and helpers through this path.
from accelerando.commands.launch.reference import validate_launch_command as _validate_launch_command  # noqa: F401
from accelerando.commands.launch.resolution import plan_for as _plan_for  # noqa: F401
from accelerando.commands.launch.resolution import resolve_launch_settings

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
    "parse",
    "resolve_launch_settings",
    "run",
    "sagemaker_launcher",
    "simple_launcher",
    "tpu_launcher",
    "tpu_pod_launcher",
]

#: Where the config file is read from without --config_file; made on first use (see :mod:`.reference`).
default_config_file: str


def __getattr__(name: str) -> object:
    """``default_config_file``, computed on first use (see :mod:`.reference`).

    Raises:
        AttributeError: for any other name.
    """
    if name != "default_config_file":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return reference.default_config_file


if __name__ == "__main__":  # pragma: no cover - `python -m` runs __main__.py; kept for direct runs
    import sys

    sys.exit(main())
