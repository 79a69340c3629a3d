"""The source-layout page lists the import layers of pyproject.toml's contract, in the same order."""

from __future__ import annotations

import pathlib
import re
import sys

import pytest

tomllib = pytest.importorskip("tomllib") if sys.version_info >= (3, 11) else pytest.importorskip("tomli")

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _contract_layers() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    (layers,) = [c["layers"] for c in config["tool"]["importlinter"]["contracts"] if c["type"] == "layers"]
    return list(layers)


def _documented_layers() -> list[str]:
    page = (ROOT / "docs" / "concepts" / "source-layout.md").read_text()
    match = re.search(r"Imports go only downwards.*?```text\n(.*?)```", page, flags=re.S)
    assert match, "docs/concepts/source-layout.md lost its ```text block of layers"
    return [line.strip() for line in match.group(1).splitlines() if line.strip()]


def test_the_docs_list_the_contract_layers_in_order() -> None:
    assert _documented_layers() == _contract_layers()
