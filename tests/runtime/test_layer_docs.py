"""The source-layout page lists the import layers of pyproject.toml's contracts, in the same order."""

from __future__ import annotations

import pathlib
import re
import sys

import pytest

tomllib = pytest.importorskip("tomllib") if sys.version_info >= (3, 11) else pytest.importorskip("tomli")

ROOT = pathlib.Path(__file__).resolve().parents[2]

# contract id -> the sentence that introduces its ```text block on the page
_BLOCKS = {
    "layers": "Imports go only downwards",
    "backends-layers": "Inside `backends/`",
    "core-layers": "Inside `core/`",
}


def _contract_layers(contract_id: str) -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    (layers,) = [c["layers"] for c in config["tool"]["importlinter"]["contracts"] if c["id"] == contract_id]
    return list(layers)


def _documented_layers(introduction: str) -> list[str]:
    page = (ROOT / "docs" / "concepts" / "source-layout.md").read_text()
    match = re.search(re.escape(introduction) + r".*?```text\n(.*?)```", page, flags=re.S)
    assert match, f"docs/concepts/source-layout.md lost the ```text block after {introduction!r}"
    return [line.strip() for line in match.group(1).splitlines() if line.strip()]


@pytest.mark.parametrize("contract_id", sorted(_BLOCKS))
def test_the_docs_list_the_contract_layers_in_order(contract_id: str) -> None:
    assert _documented_layers(_BLOCKS[contract_id]) == _contract_layers(contract_id)


def test_every_layers_contract_is_documented() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    ids = {c["id"] for c in config["tool"]["importlinter"]["contracts"] if c["type"] == "layers"}
    assert ids == set(_BLOCKS)
