"""One precision story: the docs' table, the command help, the config questions and the runtime
warning say the same thing about what is native and what is emulated on CPU and GPU."""

from __future__ import annotations

import argparse
import pathlib
import re

import pytest

from accelerando.backends.precision import advice

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
TABLE_PAGE = DOCS / "guides" / "mixed-precision.md"

# Claims the old texts made and the facts contradict (bf16 and fp16 autocast run on CPU).
_FALSE_CLAIMS = [
    re.compile(r"bf16[^.|]*(needs|requires)[^.|]*(Ampere|GPU)", re.I),
    re.compile(r"fp16[^.|]*(needs|requires)[^.|]*GPU", re.I),
    re.compile(r"fp8[^.|]*(needs|requires)[^.|]*Hopper", re.I),
]


def _default_help() -> str:
    from accelerando.commands.config.default import default_command_parser

    sub = default_command_parser(argparse.ArgumentParser().add_subparsers(), [])
    return sub.format_help()


def _texts() -> dict[str, str]:
    from accelerando.commands.config.questions import _PRECISION_NOTES
    from accelerando.core.settings.fields import get_field

    texts = {str(p.relative_to(ROOT)): p.read_text(encoding="utf-8") for p in sorted(DOCS.rglob("*.md"))}
    texts["README.md"] = (ROOT / "README.md").read_text(encoding="utf-8")
    texts["field mixed_precision help"] = get_field("mixed_precision").help
    texts["config default --help"] = _default_help()
    for cpu, notes in _PRECISION_NOTES.items():
        texts[f"config questions ({'cpu' if cpu else 'gpu'})"] = "\n".join(
            f"{k} ({v})." for k, v in notes.items()
        )
    return texts


def _table() -> dict[str, tuple[str, str]]:
    rows = {}
    for line in TABLE_PAGE.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0] in ("`no`", "`bf16`", "`fp16`", "`fp8`"):
            rows[cells[0].strip("`")] = (cells[1], cells[2])
    return rows


def test_no_text_contradicts_the_facts() -> None:
    found = [
        f"{where}: {m.group(0)!r}"
        for where, text in _texts().items()
        for pattern in _FALSE_CLAIMS
        for m in pattern.finditer(text)
    ]
    assert found == []


def test_the_table_states_each_choice_on_cpu_and_gpu() -> None:
    table = _table()
    assert set(table) == {"no", "bf16", "fp16", "fp8"}
    cpu = {k: v[0].lower() for k, v in table.items()}
    gpu = {k: v[1] for k, v in table.items()}
    assert "emulated" in cpu["fp16"] and "emulated" in cpu["fp8"] and "emulated" in cpu["bf16"]
    assert "bf16 kernels" in cpu["bf16"] and "scaler" in cpu["fp16"]
    assert "8.0" in gpu["bf16"] and "Ampere" in gpu["bf16"] and "8.9" in gpu["fp8"]
    assert gpu["fp16"].startswith("Native")


def test_help_and_questions_agree_with_the_table() -> None:
    from accelerando.commands.config.questions import _PRECISION_NOTES
    from accelerando.core.settings.fields import get_field

    help_ = get_field("mixed_precision").help
    assert "emulate" in help_ and "CPU" in help_ and "Ampere" in help_
    default_help = " ".join(_default_help().split())
    assert "8.9" in default_help and "CPUs with bf16 kernels" in default_help
    cpu, gpu = _PRECISION_NOTES[True], _PRECISION_NOTES[False]
    assert "emulated" in cpu["fp16"] and "emulated" in cpu["fp8"] and "bf16 kernels" in cpu["bf16"]
    assert "8.0" in gpu["bf16"] and "8.9" in gpu["fp8"] and "emulated" not in gpu["fp16"]


@pytest.mark.parametrize("bf16_kernels", [True, False])
def test_the_runtime_warning_follows_the_table_on_cpu(monkeypatch, bf16_kernels) -> None:
    monkeypatch.setattr(advice, "cpu_has_native", lambda dtype: dtype == "bf16" and bf16_kernels)
    assert advice.precision_advice("no", "cpu") is None
    # "fast on CPUs with bf16 kernels", emulated on the others
    assert (advice.precision_advice("bf16", "cpu") is None) is bf16_kernels
    assert advice.precision_advice("fp16", "cpu") is not None  # "emulated ... except fp16 arithmetic"
    assert advice.precision_advice("fp8", "cpu", "ao") is not None  # "emulated"


def test_the_runtime_warning_follows_the_table_on_gpu(monkeypatch) -> None:
    for capability, emulated in [((7, 5), {"bf16", "fp8"}), ((8, 0), {"fp8"}), ((8, 9), set())]:
        monkeypatch.setattr(advice, "_cuda_capability", lambda c=capability: c)
        warned = {p for p in ("no", "bf16", "fp16", "fp8") if advice.precision_advice(p, "cuda", "ao")}
        assert warned == emulated, capability
