"""The questions of ``accelerando config`` for training on this machine or a cluster of machines.

The questions themselves live in :mod:`accelerando.commands.config.questions`; this module turns the
answers into a :class:`~accelerando.commands.config.config_args.ClusterConfig` and holds the option
lists the questions offer.
"""

from __future__ import annotations

from accelerando.commands.config.config_args import ClusterConfig
from accelerando.commands.config.config_utils import DYNAMO_BACKENDS
from accelerando.commands.config.questions import ask_questions
from accelerando.common.constants import (
    DEEPSPEED_MULTINODE_LAUNCHERS,
    FSDP2_STATE_DICT_TYPE,
    FSDP_AUTO_WRAP_POLICY,
    FSDP_BACKWARD_PREFETCH,
    FSDP_SHARDING_STRATEGY,
    FSDP_STATE_DICT_TYPE,
    TORCH_DYNAMO_MODES,
)
from accelerando.core.settings.configfile import settings_to_config

__all__ = [
    "DEEPSPEED_MULTINODE_LAUNCHERS",
    "DYNAMO_BACKENDS",
    "FSDP2_STATE_DICT_TYPE",
    "FSDP_AUTO_WRAP_POLICY",
    "FSDP_BACKWARD_PREFETCH",
    "FSDP_SHARDING_STRATEGY",
    "FSDP_STATE_DICT_TYPE",
    "TORCH_DYNAMO_MODES",
    "answers_to_config",
    "get_cluster_input",
]


def answers_to_config(values: dict, source: str = "answers") -> ClusterConfig:
    """Turn setting values (as the questions return them) into a validated :class:`ClusterConfig`.

    Args:
        values: setting name -> value.
        source: how to name the answers in error messages.

    Returns:
        The config.

    Raises:
        ConfigError: a value the launcher would refuse (the message names it).
    """
    return ClusterConfig._from_mapping(settings_to_config(values), source)  # type: ignore[return-value]


def get_cluster_input() -> ClusterConfig | None:
    """Ask, in the terminal, how to train on this machine (or cluster) and build the config.

    Returns:
        The config, or ``None`` when the user cancelled (Ctrl-C / Ctrl-D).

    Raises:
        ImportError: questionary is not installed (the message gives the install command).
    """
    try:
        import questionary  # noqa: F401 - checked here to give the install fix
    except ImportError as err:
        raise ImportError(
            "The questions of `accelerando config` need questionary. Fix: `pip install questionary`, "
            "or run `accelerando config default`."
        ) from err

    values = ask_questions()
    return None if values is None else answers_to_config(values)
