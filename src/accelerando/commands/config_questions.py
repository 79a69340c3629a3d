"""The interactive questions of ``accelerando config``, asked with questionary.

Each question maps to one setting of :mod:`accelerando.settings.fields`; the answers are validated by
the same parser that reads config files, so a typo is re-asked instead of written.
"""

from __future__ import annotations

from typing import Any

from accelerando.settings.fields import get_field
from accelerando.settings.machine import visible_gpu_count
from accelerando.settings.resolve import parse_value

__all__ = ["ask_questions", "MACHINE_TYPES"]

#: answer -> distributed_type written to the file.
MACHINE_TYPES: dict[str, str] = {
    "This machine, one process": "NO",
    "multi-CPU": "MULTI_CPU",
    "multi-GPU": "MULTI_GPU",
    "FSDP (fully sharded data parallel)": "FSDP",
    "DeepSpeed": "DEEPSPEED",
}


class _Cancelled(Exception):
    """The user pressed Ctrl-C or Ctrl-D."""


def _answer(question: Any) -> Any:
    value = question.ask()
    if value is None:
        raise _Cancelled
    return value


def _validator(name: str) -> Any:
    def check(text: str) -> bool | str:
        """questionary validator: True, or the message shown under the prompt."""
        try:
            parse_value(name, text, "answer")
        except ValueError:
            return f"Expected {get_field(name).describe_allowed()}."
        return True

    return check


def _ask_value(name: str, message: str, default: Any) -> Any:
    import questionary

    text = _answer(questionary.text(message, default=str(default), validate=_validator(name)))
    return parse_value(name, text, "answer")


def _ask_choice(name: str, message: str, default: str | None = None) -> str:
    import questionary

    choices = list(get_field(name).choices or ())
    return _answer(questionary.select(message, choices=choices, default=default or choices[0]))


def _ask_topology(values: dict[str, Any], dist: str, gpus: int) -> None:
    import questionary

    if dist == "NO":
        values["num_processes"] = 1
        values["cpu"] = gpus == 0 or _answer(questionary.confirm("Run on CPU only?", default=False))
        return
    values["num_machines"] = _ask_value("num_machines", "How many machines?", 1)
    if values["num_machines"] > 1:
        values["machine_rank"] = _ask_value("machine_rank", "Rank of this machine?", 0)
        values["main_process_ip"] = _ask_value("main_process_ip", "IP address of the machine of rank 0?", "")
        values["main_process_port"] = _ask_value("main_process_port", "Port on the machine of rank 0?", 29500)
    default_processes = max(gpus, 1) * values["num_machines"] if dist != "MULTI_CPU" else 2
    values["num_processes"] = _ask_value("num_processes", "How many processes in total?", default_processes)
    values["cpu"] = dist == "MULTI_CPU"
    if dist != "MULTI_CPU" and gpus:
        values["gpu_ids"] = _ask_value("gpu_ids", "Which GPUs (ids separated by commas, or all)?", "all")


def _ask_backend(values: dict[str, Any], dist: str) -> None:
    import questionary

    if dist == "FSDP":
        values["fsdp_version"] = _ask_choice("fsdp_version", "FSDP version?", "2")
        values["fsdp_sharding_strategy"] = _ask_choice("fsdp_sharding_strategy", "Sharding strategy?")
        values["fsdp_auto_wrap_policy"] = _ask_choice("fsdp_auto_wrap_policy", "Auto wrap policy?")
        values["fsdp_offload_params"] = _answer(
            questionary.confirm("Offload parameters to CPU?", default=False)
        )
        values["fsdp_state_dict_type"] = _ask_choice(
            "fsdp_state_dict_type", "State dict type?", "SHARDED_STATE_DICT"
        )
    elif dist == "DEEPSPEED":
        values["zero_stage"] = _ask_value("zero_stage", "ZeRO stage (0-3, or auto)?", 2)
        values["offload_optimizer_device"] = _ask_choice(
            "offload_optimizer_device", "Offload optimizer state to?"
        )
        values["gradient_clipping"] = _ask_value("gradient_clipping", "Gradient clipping value?", 1.0)


def ask_questions(gpu_count: int | None = None) -> dict[str, Any] | None:
    """Ask where and how to train, and return the implied setting values.

    Args:
        gpu_count: GPUs to offer choices for; ``None`` counts this machine's (without CUDA).

    Returns:
        Setting name -> value (ready for :func:`accelerando.settings.configfile.settings_to_config`),
        or ``None`` when the user cancelled.
    """
    import questionary

    gpus = visible_gpu_count() if gpu_count is None else gpu_count
    kinds = [k for k, v in MACHINE_TYPES.items() if gpus or v in ("NO", "MULTI_CPU")]
    try:
        dist = MACHINE_TYPES[_answer(questionary.select("Which kind of training?", choices=kinds))]
        values: dict[str, Any] = {"distributed_type": dist, "num_machines": 1, "machine_rank": 0}
        _ask_topology(values, dist, gpus)
        _ask_backend(values, dist)
        values["gradient_accumulation_steps"] = _ask_value(
            "gradient_accumulation_steps", "Gradient accumulation steps?", 1
        )
        if _answer(questionary.confirm("Compile the model with torch.compile?", default=False)):
            values["dynamo_backend"] = _ask_choice(
                "dynamo_backend", "Which torch.compile backend?", "INDUCTOR"
            )
        values["debug"] = _answer(
            questionary.confirm("Check collective operations (debug mode)?", default=False)
        )
        values["mixed_precision"] = _ask_choice("mixed_precision", "Mixed precision?", "no")
    except (_Cancelled, KeyboardInterrupt):
        return None
    return values
