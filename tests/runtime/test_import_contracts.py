"""The import layers and the absence of cycles (pyproject.toml's import-linter contracts)."""

from __future__ import annotations

import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _lint_imports(cwd: pathlib.Path) -> subprocess.CompletedProcess:
    script = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"
    return subprocess.run(
        [sys.executable, "-c", script, "--no-cache"],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(cwd / "src"), "PATH": "/usr/bin:/bin"},
        timeout=240,
    )


def test_contracts_are_kept():
    result = _lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Contracts: 4 kept, 0 broken." in result.stdout


@pytest.fixture
def tree_copy(tmp_path: pathlib.Path) -> pathlib.Path:
    """A copy of src/ and pyproject.toml to break on purpose."""
    shutil.copytree(ROOT / "src" / "accelerando", tmp_path / "src" / "accelerando")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def _append(path: pathlib.Path, line: str) -> None:
    path.write_text(path.read_text() + "\n" + line + "\n")


def test_an_upward_import_breaks_the_layers(tree_copy: pathlib.Path):
    # settings sits below the runtime: importing the runtime from it is an upward import.
    _append(tree_copy / "src/accelerando/core/settings/fields.py", "import accelerando.core.runtime  # noqa")
    result = _lint_imports(tree_copy)
    assert result.returncode != 0
    assert "accelerando.core.settings is not allowed to import accelerando.core.runtime" in result.stdout


def test_a_cycle_between_siblings_breaks_the_contracts(tree_copy: pathlib.Path):
    # Two modules of the checkpointing package importing each other.
    _append(
        tree_copy / "src/accelerando/checkpointing/files.py",
        "def _late():\n    import accelerando.checkpointing.save  # noqa",
    )
    result = _lint_imports(tree_copy)
    assert result.returncode != 0
    assert "No cycles between the sibling modules of any package BROKEN" in result.stdout
