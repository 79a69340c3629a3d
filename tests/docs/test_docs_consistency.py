"""What the documentation tells a user to type or look for matches the project (issue 42, item 6).

- Every ``pip install`` line that installs torch pins it, at the README's version: an unpinned
  ``pip install torch`` on Linux fetches a multi-GB CUDA build of whatever version is newest.
- File names the guides promise are the ones the code writes (the checkpoint manifest).
- No ``__main__`` module of the package runs its command on import: mkdocstrings imports them while
  building the site, which printed ``accelerando config: error: invalid choice: 'build'``.
"""

from __future__ import annotations

import importlib
import pathlib
import re
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
_PIN = re.compile(r"^pip install torch==(\S+) ", re.M)
_TORCH_TOKEN = re.compile(r"""^["']?torch(?:\[[^\]]*\])?(?:[<>=!~;].*)?["']?$""")


def _documents() -> list[pathlib.Path]:
    return [
        ROOT / "README.md",
        *sorted((ROOT / "docs").rglob("*.md")),
        *sorted((ROOT / "examples").rglob("README.md")),
    ]


def _torch_specs(line: str) -> list[str]:
    """The torch requirements a shell line's ``pip install`` commands name (comments left out)."""
    command = line.split(" #", 1)[0]
    specs = []
    for part in re.split(r"&&|\|\||;", command):
        words = part.split()
        if words[:2] == ["pip", "install"] or words[1:3] == ["pip", "install"]:
            specs += [word.strip("\"'") for word in words if _TORCH_TOKEN.match(word)]
    return specs


def test_every_install_line_pins_torch_at_the_readmes_version() -> None:
    pins = _PIN.findall((ROOT / "README.md").read_text(encoding="utf-8"))
    assert pins and len(set(pins)) == 1, pins
    wanted = f"torch=={pins[0]}"
    found, wrong = 0, []
    for document in _documents():
        for number, line in enumerate(document.read_text(encoding="utf-8").splitlines(), 1):
            for spec in _torch_specs(line):
                found += 1
                if spec != wanted:
                    wrong.append(f"{document.relative_to(ROOT)}:{number}: {spec!r} (want {wanted!r})")
    assert found >= 4  # the README's two lines, contributing, getting started
    assert not wrong, "\n".join(wrong)


def test_the_torch_spec_reader() -> None:
    assert _torch_specs("pip install torch") == ["torch"]
    assert _torch_specs('pip install "torch>=2.6" numpy && pip install -e .') == ["torch>=2.6"]
    assert _torch_specs("pip install torch==2.13.0 && pip install -e .") == ["torch==2.13.0"]
    assert _torch_specs('pip install "accelerando[torchft]"  # it needs torch>=2.7') == []
    assert _torch_specs("pip install torchvision torchao") == []


def test_the_guides_name_the_checkpoint_manifest_as_written() -> None:
    from accelerando.checkpointing.manifest import MANIFEST_NAME

    assert MANIFEST_NAME == "checkpoint_manifest.json"
    stale = re.compile(r"(?<![\w.])manifest\.json")
    wrong = [
        f"{document.relative_to(ROOT)}:{number}"
        for document in _documents()
        for number, line in enumerate(document.read_text(encoding="utf-8").splitlines(), 1)
        if stale.search(line)
    ]
    assert not wrong, f"the manifest is {MANIFEST_NAME}, not manifest.json: {wrong}"
    assert MANIFEST_NAME in (ROOT / "docs" / "guides" / "checkpointing.md").read_text(encoding="utf-8")


@pytest.mark.parametrize(
    "module",
    sorted(
        ".".join(path.relative_to(ROOT / "src").with_suffix("").parts)
        for path in (ROOT / "src" / "accelerando").rglob("__main__.py")
    ),
)
def test_importing_a_main_module_runs_nothing(module: str, monkeypatch, capsys) -> None:
    monkeypatch.setattr(sys, "argv", ["mkdocs", "build"])  # what the importer's own command line was
    monkeypatch.delitem(sys.modules, module, raising=False)
    importlib.import_module(module)  # a SystemExit here is the bug
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == "", captured
