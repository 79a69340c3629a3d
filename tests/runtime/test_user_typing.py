"""Types reach the user: pyright (basic), run as a user would, finds no error in what we show users.

A user's project is a folder with its own ``pyrightconfig.json`` (basic mode) and accelerando
installed; into it go the README's Python blocks (after a preamble that defines the names the README
leaves to the user: ``model``, ``optimizer``, ...), every script of ``examples/``, and every Python
block of ``docs/`` (where a name a snippet leaves to the user is not an error: the snippets'
undefined names are the user's own, so ``reportUndefinedVariable`` is off in those files only).
One checker run covers them all (about half a minute of CPU).
"""

from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
# What the README's five lines leave to the user, defined as a user's script would.
README_PREAMBLE = """\
import torch
from torch.utils.data import DataLoader, TensorDataset

model = torch.nn.Linear(2, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
train_loader = DataLoader(TensorDataset(torch.randn(8, 2), torch.randn(8, 2)), batch_size=4)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1)
loss_fn = torch.nn.functional.mse_loss
predictions = torch.zeros(2)
"""


def _python_blocks(markdown: Path) -> list[str]:
    return [match.group(1) for match in FENCE.finditer(markdown.read_text())]


def _user_project(folder: Path) -> list[str]:
    """Write the user's project; the names of its files (relative to ``folder``)."""
    (folder / "pyrightconfig.json").write_text(json.dumps({"typeCheckingMode": "basic"}))
    files: list[str] = []
    readme = "\n".join(_python_blocks(ROOT / "README.md"))
    (folder / "readme_blocks.py").write_text(README_PREAMBLE + readme)
    files.append("readme_blocks.py")
    shutil.copytree(
        ROOT / "examples", folder / "examples", ignore=shutil.ignore_patterns("__pycache__", "*.md")
    )
    files += [str(p.relative_to(folder)) for p in sorted((folder / "examples").rglob("*.py"))]
    (folder / "docs").mkdir()
    for page in sorted((ROOT / "docs").rglob("*.md")):
        for index, block in enumerate(_python_blocks(page)):
            ast.parse(block, filename=f"{page.relative_to(ROOT)} block {index}")  # a snippet must parse
            name = f"docs/{page.stem}_{index}.py"
            (folder / name).write_text("# pyright: reportUndefinedVariable=false\n" + block)
            files.append(name)
    return files


def test_readme_examples_and_docs_have_no_type_error_for_a_user(tmp_path: Path) -> None:
    checker = Path(sys.executable).with_name("basedpyright")
    if not checker.exists():
        pytest.fail("basedpyright is missing: pip install -e '.[test]' (it is in the test extra)")
    files = _user_project(tmp_path)
    assert len(files) > 30, files  # the README, the examples and the docs' blocks were all found
    done = subprocess.run(
        [str(checker), "--outputjson", "--pythonpath", sys.executable, *files],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    report = json.loads(done.stdout)
    errors = [
        f"{Path(d['file']).relative_to(tmp_path)}:{d['range']['start']['line'] + 1}: "
        f"{d['message'].splitlines()[0]} ({d.get('rule')})"
        for d in report["generalDiagnostics"]
        if d["severity"] == "error"
    ]
    assert report["summary"]["filesAnalyzed"] >= len(files)
    assert not errors, f"{len(errors)} type errors a user would see:\n" + "\n".join(errors)


# A user reading settings: each read has its table type (reveal_type notes), a misspelled name is an error.
SETTINGS_READS = """\
from accelerando import Accelerator
from accelerando.core.settings import resolve_runtime_settings

settings = resolve_runtime_settings({"mixed_precision": "bf16"})
reveal_type(settings.gradient_accumulation_steps)
reveal_type(settings.cpu)
reveal_type(settings.num_processes)
reveal_type(settings.checkpoint_lock_wait)
reveal_type(settings.mixed_precision)
reveal_type(settings.fsdp_transformer_layer_cls_to_wrap)
reveal_type(settings.source("mixed_precision"))
reveal_type(Accelerator(cpu=True).runtime.settings.gradient_accumulation_steps)
reveal_type(Accelerator(cpu=True).settings.auto_resume)
settings.gradient_acumulation_steps
"""
SETTINGS_TYPES = [
    ("settings.gradient_accumulation_steps", "int"),
    ("settings.cpu", "bool"),
    ("settings.num_processes", "int | None"),
    ("settings.checkpoint_lock_wait", "float | None"),
    ("settings.mixed_precision", "Literal['no', 'fp8', 'fp16', 'bf16']"),
    ("settings.fsdp_transformer_layer_cls_to_wrap", "tuple[str, ...] | None"),
    ('settings.source("mixed_precision")', "str"),
    ("Accelerator(cpu=True).runtime.settings.gradient_accumulation_steps", "int"),
    ("Accelerator(cpu=True).settings.auto_resume", "bool"),
]


def test_settings_reads_are_typed_and_a_misspelled_setting_is_an_error(tmp_path: Path) -> None:
    checker = Path(sys.executable).with_name("basedpyright")
    if not checker.exists():
        pytest.fail("basedpyright is missing: pip install -e '.[test]' (it is in the test extra)")
    (tmp_path / "pyrightconfig.json").write_text(json.dumps({"typeCheckingMode": "basic"}))
    (tmp_path / "reads.py").write_text(SETTINGS_READS)
    done = subprocess.run(
        [str(checker), "--outputjson", "--pythonpath", sys.executable, "reads.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    diagnostics = json.loads(done.stdout)["generalDiagnostics"]
    revealed = [d["message"] for d in diagnostics if d["severity"] == "information"]
    assert revealed == [f'Type of "{expr}" is "{type_}"' for expr, type_ in SETTINGS_TYPES]
    errors = [
        (d["range"]["start"]["line"] + 1, d["message"].splitlines()[0])
        for d in diagnostics
        if d["severity"] == "error"
    ]
    assert errors == [
        (
            len(SETTINGS_READS.splitlines()),
            'Cannot access attribute "gradient_acumulation_steps" for class "Settings"',
        )
    ]
