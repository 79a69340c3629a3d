"""The documentation site builds strictly, its generated pages follow the code, and every name
the API reference renders has a docstring."""

from __future__ import annotations

import importlib
import inspect
import os
import pathlib
import re
import subprocess
import sys
from typing import Any

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
_DIRECTIVE = re.compile(r"^::: *([\w.]+)", re.M)


def _load_hook() -> Any:
    spec = importlib.util.spec_from_file_location("_cli_reference_hook", DOCS / "hooks" / "cli_reference.py")
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module


def _resolve(path: str) -> Any:
    """Import ``package.module.Name.attr`` (the longest importable module prefix, then attributes)."""
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for part in parts[i:]:
            obj = getattr(obj, part)
        return obj
    raise ImportError(path)


def _rendered_names() -> list[str]:
    names = []
    for page in sorted(DOCS.rglob("*.md")):
        names += _DIRECTIVE.findall(page.read_text(encoding="utf-8"))
    return names


@pytest.mark.slow
def test_site_builds_strictly(tmp_path: pathlib.Path) -> None:
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    pytest.importorskip("mkdocstrings_handlers.python")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "-f",
            str(ROOT / "mkdocs.yml"),
            "-d",
            str(tmp_path),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-6000:]
    cli = (tmp_path / "reference" / "cli" / "index.html").read_text(encoding="utf-8")
    assert "ACCELERANDO_MIXED_PRECISION" in cli
    api = (tmp_path / "reference" / "api" / "accelerator" / "index.html").read_text(encoding="utf-8")
    assert "save_state" in api and "gather_for_metrics" in api
    for figure in ("memory_timeline.png", "device_map.png", "launch_processes.png"):
        assert (tmp_path / "img" / figure).stat().st_size > 1000


def test_cli_reference_covers_every_setting() -> None:
    from accelerando.core.settings.fields import FIELDS

    page = _load_hook().render_cli_reference()
    assert "| setting |" not in page  # definition lists, not a 7-column table that wraps names mid-word
    for field in FIELDS:
        terms = [line for line in page.splitlines() if line.startswith(f"`{field.cli or field.name}")]
        assert terms and terms[0].endswith("{ .cli-term }"), field.name  # one entry per setting
        assert field.our_env in page
        if field.cli not in (None, f"--{field.name}"):
            assert f"**setting** `{field.name}`" in page, field.name
        for key in field.config_keys:
            assert f"`{key}`" in page
    assert "--dry_run" in page  # a launcher option outside the settings table


def test_every_rendered_name_has_a_docstring() -> None:
    names = _rendered_names()
    assert len(names) > 40, names
    missing = []
    for name in names:
        obj = _resolve(name)
        if not (inspect.getdoc(obj) or "").strip():
            missing.append(name)
        if not inspect.isclass(obj):
            continue
        for attr in dir(obj):
            if attr.startswith("_"):
                continue
            owners = [k for k in obj.__mro__ if attr in vars(k)]
            if not owners or not owners[0].__module__.startswith("accelerando"):
                continue  # inherited from Python or torch, not ours to document
            raw = inspect.getattr_static(obj, attr)
            target = raw.fget if isinstance(raw, property) else getattr(raw, "__func__", raw)
            if not (isinstance(raw, property) or inspect.isfunction(target)):
                continue
            # inspect.getdoc falls back to the overridden method's docstring, as a reader would
            doc = inspect.getdoc(getattr(obj, attr)) if not isinstance(raw, property) else raw.__doc__
            if not (doc or "").strip():
                missing.append(f"{name}.{attr}")
    assert not missing, f"public names without a docstring: {missing}"


def test_every_page_is_in_the_navigation() -> None:
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    for page in DOCS.rglob("*.md"):
        relative = page.relative_to(DOCS).as_posix()
        assert relative in config, f"{relative} is not in mkdocs.yml's nav"
