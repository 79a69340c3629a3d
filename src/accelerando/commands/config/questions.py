"""The interactive questions of ``accelerando config``, asked with questionary.

Each question maps to one setting of :mod:`accelerando.core.settings.fields`; the answers are validated by
the same parser that reads config files, so a typo is re-asked instead of written.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from accelerando.backends.strategies import DISTRIBUTED_KINDS, DistributedKind
from accelerando.core.settings.fields import get_field, machine_range
from accelerando.core.settings.machine import visible_gpu_count
from accelerando.core.settings.resolve import parse_value

if TYPE_CHECKING:
    from collections.abc import Callable

    from questionary import Question

__all__ = ["ask_questions", "MACHINE_TYPES"]

#: answer -> distributed_type written to the file (the kinds the strategies offer, in their order).
_KIND_BY_LABEL: dict[str, DistributedKind] = {k.label: k for k in DISTRIBUTED_KINDS if k.label is not None}
MACHINE_TYPES: dict[str, str] = {label: k.distributed_type for label, k in _KIND_BY_LABEL.items()}

# A backend's own questions, by the settings group of its options: (how to ask, setting, question,
# default). "choice" offers the setting's choices, "value" takes typed text, "confirm" is yes/no.
_GROUP_QUESTIONS: dict[str, tuple[tuple[str, str, str, str | int | float | bool | None], ...]] = {
    "fsdp": (
        ("choice", "fsdp_version", "FSDP version?", "2"),
        ("choice", "fsdp_sharding_strategy", "Sharding strategy?", None),
        ("choice", "fsdp_auto_wrap_policy", "Auto wrap policy?", None),
        ("confirm", "fsdp_offload_params", "Offload parameters to CPU?", False),
        ("choice", "fsdp_state_dict_type", "State dict type?", "SHARDED_STATE_DICT"),
    ),
    "deepspeed": (
        ("value", "zero_stage", "ZeRO stage (0-3, or auto)?", 2),
        ("choice", "offload_optimizer_device", "Offload optimizer state to?", None),
        ("value", "gradient_clipping", "Gradient clipping value?", 1.0),
    ),
}


# What each precision does where the run will train, shown beside the choice (the facts of the
# precision table in docs/guides/mixed-precision.md; a run on emulating hardware also warns once).
_PRECISION_NOTES: dict[bool, dict[str, str]] = {
    True: {  # CPU
        "no": "float32; the fastest on most CPUs",
        "fp8": "emulated by torchao on CPU: slower than no",
        "fp16": "emulated on most CPUs: slower than no",
        "bf16": "fast only on CPUs with bf16 kernels (AVX512/AMX, Arm bf16)",
    },
    False: {  # GPU
        "no": "float32",
        "fp8": "native on GPUs of compute capability 8.9+, emulated below",
        "fp16": "native, with loss scaling",
        "bf16": "native on GPUs from Ampere (8.0+), emulated below",
    },
}


class _Cancelled(Exception):
    """The user pressed Ctrl-C or Ctrl-D."""


def _answer(question: Question) -> Any:
    value = question.ask()
    if value is None:
        raise _Cancelled
    return value


def _validator(name: str) -> Callable[[str], bool | str]:
    def check(text: str) -> bool | str:
        """The questionary validator: True, or the message shown under the prompt."""
        try:
            parse_value(name, text, "answer")
        except ValueError:
            return f"Expected {get_field(name).describe_allowed()}."
        return True

    return check


def _ask_value(name: str, message: str, default: object) -> object:
    import questionary

    text = _answer(questionary.text(message, default=str(default), validate=_validator(name)))
    return parse_value(name, text, "answer")


def _ask_choice(name: str, message: str, default: str | None = None) -> str:
    import questionary

    choices = list(get_field(name).choices or ())
    return _answer(questionary.select(message, choices=choices, default=default or choices[0]))


def _ask_precision(cpu: bool) -> str:
    import questionary

    notes = _PRECISION_NOTES[cpu]
    choices = [
        questionary.Choice(f"{name} ({notes[name]})" if name in notes else name, value=name)
        for name in get_field("mixed_precision").choices or ()
    ]
    return _answer(questionary.select("Mixed precision?", choices=choices, default=choices[0]))


def _ask_topology(values: dict[str, object], kind: DistributedKind, gpus: int) -> None:
    import questionary

    if kind.one_process:
        values["num_processes"] = 1
        values["cpu"] = gpus == 0 or _answer(questionary.confirm("Run on CPU only?", default=False))
        return
    num_machines = values["num_machines"] = _ask_value("num_machines", "How many machines?", 1)

    # parse_value gives num_machines as an int, or a "MIN:MAX" range as text.
    most_machines = machine_range(num_machines if isinstance(num_machines, (int, str)) else None)[1]
    if most_machines > 1:
        values["machine_rank"] = _ask_value("machine_rank", "Rank of this machine?", 0)
        values["main_process_ip"] = _ask_value("main_process_ip", "IP address of the machine of rank 0?", "")
        values["main_process_port"] = _ask_value("main_process_port", "Port on the machine of rank 0?", 29500)
    default_processes = 2 if kind.forces_cpu else max(gpus, 1) * most_machines
    values["num_processes"] = _ask_value("num_processes", "How many processes in total?", default_processes)
    values["cpu"] = kind.forces_cpu
    if not kind.forces_cpu and gpus:
        values["gpu_ids"] = _ask_value("gpu_ids", "Which GPUs (ids separated by commas, or all)?", "all")


def _ask_backend(values: dict[str, object], kind: DistributedKind) -> None:
    import questionary

    for how, name, message, default in _GROUP_QUESTIONS.get(kind.settings_group or "", ()):
        if how == "choice":  # a choice's default is a choice name, or None for the first
            values[name] = _ask_choice(name, message, default if isinstance(default, str) else None)
        elif how == "confirm":  # a yes/no question's default is a bool
            values[name] = _answer(questionary.confirm(message, default=bool(default)))
        else:
            values[name] = _ask_value(name, message, default)


def ask_questions(gpu_count: int | None = None) -> dict[str, object] | None:
    """Ask where and how to train, and return the implied setting values.

    Args:
        gpu_count: GPUs to offer choices for; ``None`` counts this machine's (without CUDA).

    Returns:
        Setting name -> value (ready for :func:`accelerando.core.settings.configfile.settings_to_config`),
        or ``None`` when the user cancelled.
    """
    import questionary

    gpus = visible_gpu_count() if gpu_count is None else gpu_count
    offered = [k.label for k in DISTRIBUTED_KINDS if k.label is not None and (gpus or k.offered_without_gpu)]
    try:
        kind = _KIND_BY_LABEL[_answer(questionary.select("Which kind of training?", choices=offered))]
        values: dict[str, object] = {
            "distributed_type": kind.distributed_type,
            "num_machines": 1,
            "machine_rank": 0,
        }
        _ask_topology(values, kind, gpus)
        _ask_backend(values, kind)
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
        values["mixed_precision"] = _ask_precision(bool(values.get("cpu")))
    except (_Cancelled, KeyboardInterrupt):
        return None
    return values
