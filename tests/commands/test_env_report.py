"""`accelerando env` finds packages by import name as well as by distribution name, imports none of
them, and says "none" under an empty heading."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from accelerando.commands.env import _installed_version, collect_versions


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A site directory with ``fakemod`` (from the distribution ``fake-dist``) and ``bare`` (no dist)."""
    (tmp_path / "fakemod").mkdir()
    (tmp_path / "fakemod" / "__init__.py").write_text("raise RuntimeError('imported')\n")
    (tmp_path / "bare.py").write_text("raise RuntimeError('imported')\n")
    info = tmp_path / "fake_dist-1.2.3.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-dist\nVersion: 1.2.3\n")
    (info / "top_level.txt").write_text("fakemod\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    return tmp_path


def test_a_package_is_found_by_its_import_name(site: Path) -> None:
    by_import = dict(metadata.packages_distributions())
    assert _installed_version("fakemod", by_import) == "1.2.3 (fake-dist)"
    assert _installed_version("bare", by_import) == "installed (version unknown)"
    assert _installed_version("surely_not_a_module_xyz", by_import) == "not installed"
    assert "fakemod" not in sys.modules and "bare" not in sys.modules


@pytest.mark.skipif(importlib.util.find_spec("mlflow") is None, reason="mlflow not importable here")
def test_mlflow_is_reported_when_importable() -> None:
    assert collect_versions()["mlflow"] != "not installed"


def test_collecting_versions_imports_no_package() -> None:
    code = (
        "import sys; from accelerando.commands.env import collect_versions, _OPTIONAL; collect_versions();"
        "print(sorted(n for n in _OPTIONAL if n in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_an_empty_settings_heading_says_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    from accelerando.commands.cli import main

    for key in list(os.environ):
        if key.startswith(("ACCELERATE", "ACCELERANDO", "FSDP_")):
            monkeypatch.delenv(key)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    assert main(["env"]) == 0
    out = capsys.readouterr().out
    assert "Config file: none" in out
    heading, after = out.split("Settings in effect (value [source]):\n", 1)
    assert after.splitlines()[0].strip().startswith("none")
