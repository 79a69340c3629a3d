"""Typed ``Settings`` attributes, generated from the settings table (issue 43 item 4).

- ``core/settings/attributes.py`` equals what ``core/settings/codegen.py`` renders from the table, so
  the table stays the one source (regenerate: ``python -m accelerando.core.settings.codegen``);
- each annotation agrees with what the resolver gives (defaults, parsed values, ``| None``);
- a setting read is a plain attribute lookup: no Python-level call (counted with a profiler), where
  ``Settings.__getattr__`` was one call per read;
- ``source(name)``, immutability, equality, pickling and the error for an unknown name are unchanged.

What the type checker makes of it (``int``, ``X | None``, an error for a misspelled setting) is checked as
a user would meet it in ``tests/runtime/test_user_typing.py``.
"""

from __future__ import annotations

import copy
import dataclasses
import pickle
import subprocess
import sys

import pytest

from accelerando.core.settings import FIELDS, Settings, codegen, parse_value, resolve_runtime_settings


def test_generated_attributes_equal_the_table():
    written = codegen.TARGET.read_text()
    assert written == codegen.render(), (
        "core/settings/attributes.py is stale: run `python -m accelerando.core.settings.codegen`"
    )


def test_codegen_check_mode_agrees():
    done = subprocess.run(
        [sys.executable, "-m", "accelerando.core.settings.codegen", "--check"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def test_every_setting_is_one_property_of_the_generated_class():
    from accelerando.core.settings.attributes import SettingAttributes

    properties = [name for name, value in vars(SettingAttributes).items() if isinstance(value, property)]
    assert properties == [f.name for f in FIELDS]


def test_no_setting_shadows_a_member_of_settings():
    # Values live in the instance's __dict__: a setting named like a method or field would hide it.
    members = {name for name in dir(Settings)} | {f.name for f in dataclasses.fields(Settings)}
    assert not members & {f.name for f in FIELDS}


_PYTHON_TYPES = {"str": str, "int": int, "float": float, "bool": bool, "list": tuple}
_SAMPLES = {"str": "x", "int": "3", "float": "0.5", "bool": "true", "list": "a,b"}


@pytest.mark.parametrize("field", FIELDS, ids=lambda f: f.name)
def test_annotation_holds_the_default_and_a_parsed_value(field):
    text = codegen.annotation(field)
    assert ("None" in text.split(" | ")) is (field.default is None)
    if field.kind == "choice":
        sample = (field.choices or ())[-1]
        assert parse_value(field, sample) in (field.choices or ())
        assert text.startswith(codegen._alias(field))
        return
    expected = _PYTHON_TYPES[field.kind]
    assert text.split(" | ")[0] == codegen._KIND_TYPES[field.kind]
    if field.default is not None:
        assert isinstance(field.default, expected)
    value = parse_value(field, _SAMPLES[field.kind], "env:TEST")
    assert isinstance(value, expected) or (field.parser is not None and type(value).__name__ in text)


def test_parser_and_named_values_widen_the_type():
    by_name = {f.name: f for f in FIELDS}
    assert codegen.annotation(by_name["num_machines"]) == "int | str | None"  # "1:4" stays text
    assert codegen.annotation(by_name["zero_stage"]) == 'int | Literal["auto"] | None'
    assert codegen.annotation(by_name["gradient_accumulation_steps"]) == "int"
    assert codegen.annotation(by_name["fsdp_transformer_layer_cls_to_wrap"]) == "tuple[str, ...] | None"


def _python_calls(function) -> int:
    """Python-level calls made while ``function`` runs (its own call included)."""
    calls = 0

    def profile(frame, event, arg):
        nonlocal calls
        if event == "call":
            calls += 1

    sys.setprofile(profile)
    try:
        function()
    finally:
        sys.setprofile(None)
    return calls


def test_reading_a_setting_makes_no_python_call():
    settings = resolve_runtime_settings({"mixed_precision": "bf16"}, environ={})

    def read_settings():
        for _ in range(100):
            settings.gradient_accumulation_steps  # noqa: B018
            settings.mixed_precision  # noqa: B018
            settings.num_processes  # noqa: B018

    class Plain:
        a = b = c = 1

    plain = Plain()

    def read_plain():
        for _ in range(100):
            plain.a  # noqa: B018
            plain.b  # noqa: B018
            plain.c  # noqa: B018

    # 300 reads: only the reading function's own call, as for plain attributes (through
    # Settings.__getattr__ it was 301).
    assert _python_calls(read_settings) == _python_calls(read_plain) == 1


def test_values_sources_and_errors_are_unchanged():
    settings = resolve_runtime_settings(
        {"mixed_precision": "bf16"}, environ={"ACCELERATE_NUM_PROCESSES": "2"}
    )
    assert settings.mixed_precision == "bf16" and settings.source("mixed_precision") == "code"
    assert settings.num_processes == 2 and settings.source("num_processes") == "env:ACCELERATE_NUM_PROCESSES"
    assert (
        settings.gradient_accumulation_steps == 1
        and settings.source("gradient_accumulation_steps") == "default"
    )
    assert all(getattr(settings, name) == value for name, value, _ in settings.items())
    with pytest.raises(AttributeError, match="Settings has no field 'mixed_precison'"):
        settings.mixed_precison  # noqa: B018
    assert not hasattr(settings, "mixed_precison")
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.mixed_precision = "fp16"  # type: ignore[misc]  # pyright: ignore[reportAttributeAccessIssue]
    for twin in (pickle.loads(pickle.dumps(settings)), copy.copy(settings), copy.deepcopy(settings)):
        assert (
            twin == settings
            and twin.mixed_precision == "bf16"
            and twin.source("num_processes") == "env:ACCELERATE_NUM_PROCESSES"
        )
    changed = dataclasses.replace(settings, values={**settings.values, "mixed_precision": "fp16"})
    assert changed.mixed_precision == "fp16" and settings.mixed_precision == "bf16"
