"""ruff's rules (pyproject.toml: style, imports, docstrings on src/, complexity at most 12) hold everywhere."""

from __future__ import annotations

import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _ruff(*args: str, cwd: pathlib.Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ruff", *args], cwd=cwd, capture_output=True, text=True, timeout=240
    )


@pytest.fixture(scope="module", autouse=True)
def _ruff_installed() -> None:
    if shutil.which("ruff") is None and _ruff("--version").returncode != 0:
        pytest.fail("ruff is part of the test extra: pip install -e '.[test]'")


def test_the_tree_passes_ruff_check() -> None:
    result = _ruff("check", "--no-cache", "--output-format", "concise", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_tree_is_ruff_formatted() -> None:
    result = _ruff("format", "--check", "--no-cache", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_an_undocumented_public_function_and_a_complex_one_are_caught(tmp_path: pathlib.Path) -> None:
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    package = tmp_path / "src" / "accelerando"
    package.mkdir(parents=True)
    branches = "\n".join(f"    if x == {i}:\n        return {i}" for i in range(13))
    (package / "sample.py").write_text(
        '"""A module."""\n\n\ndef undocumented(x: int) -> int:\n' + branches + "\n    return -1\n"
    )
    result = _ruff("check", "--no-cache", "--output-format", "concise", "src", cwd=tmp_path)
    assert "D103" in result.stdout and "C901" in result.stdout, result.stdout
