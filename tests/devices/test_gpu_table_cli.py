"""benchmarks/gpu_table.py (the GPU half of the side-by-side harness) parses its options and refuses cleanly without CUDA.

The table itself needs a CUDA device and is never run in CI; here only what a CPU machine can check:
the options, the plan of rows for every group, and the one-line refusal (status 2).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_table.py"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_table_under_test", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # compare_reference's dataclasses resolve annotations through it
    spec.loader.exec_module(module)
    return module


GPU_TABLE = _script()


def test_options_parse_and_quick_shrinks_the_run() -> None:
    args = GPU_TABLE.parse_args(["--rounds", "5", "--only", "step,fsdp2", "--markdown", "t.md"])
    assert (args.rounds, args.only, args.markdown, args.child) == (5, "step,fsdp2", "t.md", None)
    quick = GPU_TABLE.parse_args(["--quick"])
    assert quick.rounds <= 2 and quick.reps <= 3 and quick.samples < args.samples


@pytest.mark.parametrize("argv", [["--only", "step,nope"], ["--rounds", "0"], ["--precision", "fp8"]])
def test_bad_options_are_one_clear_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        GPU_TABLE.parse_args(argv)
    assert exited.value.code == 2
    assert "gpu_table.py: error:" in capsys.readouterr().err


def test_every_group_plans_rows_measured_by_a_known_child() -> None:
    planned = list(GPU_TABLE._plan(GPU_TABLE.parse_args([])))
    figures = {figure for _, figure, _, _ in planned}
    assert figures <= set(GPU_TABLE.CHILDREN)
    labels = " ".join(row.label for row, _, _, _ in planned)
    for wanted in ("accumulation 4", "bf16", "FSDP2 epoch on 1 device", "big-model load", "dataloader"):
        assert wanted in labels
    # The options each row's child is given parse as the child's own.
    for _, figure, extra, _ in planned:
        GPU_TABLE.parse_args(["--child", figure, "--lib", "accelerando", *extra])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_without_cuda_it_refuses_with_one_line() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick"], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.strip() == GPU_TABLE.NO_DEVICE
    assert len(done.stderr.strip().splitlines()) == 1


def _rehearsal(groups: str, tmp_path: Path) -> str:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--rehearse", "--only", groups, "--workdir", str(tmp_path / "big")],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "REHEARSAL on the CPU" in done.stdout
    return done.stdout


def _figures(stdout: str, label_part: str) -> list[str]:
    """The accelerando, reference and raw cells of the row whose label holds ``label_part``."""
    (line,) = [line for line in stdout.splitlines() if line.startswith("|") and label_part in line]
    return [cell.strip() for cell in line.strip("|").split("|")][1:4]


@pytest.mark.slow
def test_a_cpu_rehearsal_runs_every_group_end_to_end(tmp_path: Path) -> None:
    """Every child's code path (bf16 autocast, FSDP2 under torchrun, the big-model load) runs on the CPU,
    so the first GPU session spends its minutes measuring, not mending the script."""
    stdout = _rehearsal(",".join(GPU_TABLE.GROUPS), tmp_path)
    for label in ("first `Accelerator()`", "no precision, accumulation 1", "no precision, accumulation 4",
                  "bf16 precision", "dataloader", "big-model"):  # fmt: skip
        accelerando, reference, raw = _figures(stdout, label)
        assert accelerando != "-" and reference != "-", (label, stdout)
        if not label.startswith("first"):
            assert raw != "-", (label, stdout)
    accelerando, _, raw = _figures(stdout, "FSDP2")  # on the CPU the reference's child runs DDP
    assert accelerando != "-" and raw != "-", stdout
    assert not [line for line in stdout.splitlines() if line.startswith("- ")], stdout  # no child failed


def test_a_failing_child_is_named_by_its_exception_line() -> None:
    report = "[rank0]: Traceback...\n[rank0]: ValueError: no\nChildFailedError: \n=====\n  rank: 0\n"
    assert GPU_TABLE._cause(report) == "ValueError: no"
    assert GPU_TABLE._cause("") == "(no output)"
