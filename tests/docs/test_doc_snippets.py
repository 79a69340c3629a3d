"""Every complete ```python block of the documentation runs.

A block is complete unless the line before its fence is ``<!-- fragment -->`` (a piece of a script
shown for reading; it is not run). ``<!-- slow -->`` before a block runs it under the slow marker
only. Each complete block runs in a fresh Python process in an empty folder, on CPU.
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
_BLOCK = re.compile(
    r"(?:^(<!-- *(fragment|slow) *-->)[ \t]*\n)?^```python[^\n]*\n(.*?)^```[ \t]*$", re.M | re.S
)


def _blocks() -> list[tuple[str, str, str]]:
    """(id, marker, code) of every python block in the documentation."""
    found = []
    for page in sorted(DOCS.rglob("*.md")):
        text = page.read_text(encoding="utf-8")
        for match in _BLOCK.finditer(text):
            line = text.count("\n", 0, match.start(3))
            found.append(
                (f"{page.relative_to(DOCS).as_posix()}:{line}", match.group(2) or "", match.group(3))
            )
    return found


def _params() -> list[object]:
    params = []
    for ident, marker, code in _blocks():
        if marker == "fragment":
            continue
        # Each block starts a fresh interpreter with torch (5-10 s on 2 cores): the default run keeps the
        # getting-started page's; `python -m pytest -m slow tests/docs` runs every page's.
        in_default = marker != "slow" and ident.startswith("getting-started.md")
        marks = [] if in_default else [pytest.mark.slow]
        params.append(pytest.param(code, id=ident, marks=marks))
    return params


def test_blocks_are_found() -> None:
    blocks = _blocks()
    assert len(blocks) > 20
    assert any(marker == "" for _, marker, _ in blocks)
    assert any(marker == "fragment" for _, marker, _ in blocks)


@pytest.mark.parametrize("code", _params())
def test_complete_block_runs(code: str, tmp_path: pathlib.Path) -> None:
    script = tmp_path / "snippet.py"
    script.write_text(code, encoding="utf-8")
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("ACCELERANDO_", "ACCELERATE_", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_"))
    }
    env.update(
        CUDA_VISIBLE_DEVICES="",
        OMP_NUM_THREADS="1",
        PYTHONDONTWRITEBYTECODE="1",
        HF_HUB_OFFLINE="1",
        WANDB_MODE="disabled",
        NO_MKDOCS_2_WARNING="1",
    )
    result = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240
    )
    assert result.returncode == 0, (
        f"--- code ---\n{code}\n--- stdout ---\n{result.stdout[-3000:]}\n--- stderr ---\n{result.stderr[-5000:]}"
    )
