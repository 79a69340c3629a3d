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


@pytest.fixture(scope="module")
def built_site(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[pathlib.Path, subprocess.CompletedProcess[str]]:
    """The site built once (``mkdocs build --strict``) for the tests of this module that read it."""
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    pytest.importorskip("mkdocstrings_handlers.python")
    site = tmp_path_factory.mktemp("site")
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
            str(site),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return site, result


@pytest.mark.slow
def test_site_builds_strictly(built_site: tuple[pathlib.Path, subprocess.CompletedProcess[str]]) -> None:
    tmp_path, result = built_site
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-6000:]
    # A clean build prints nothing that says error (a module run on import once printed
    # "accelerando config: error: invalid choice: 'build'" and the build still succeeded).
    output = result.stdout + result.stderr
    assert "error" not in output.lower(), output[-6000:]
    cli = (tmp_path / "reference" / "cli" / "index.html").read_text(encoding="utf-8")
    assert "ACCELERANDO_MIXED_PRECISION" in cli
    api = (tmp_path / "reference" / "api" / "accelerator" / "index.html").read_text(encoding="utf-8")
    assert "save_state" in api and "gather_for_metrics" in api
    for figure in ("memory_timeline.png", "device_map.png", "launch_processes.png"):
        assert (tmp_path / "img" / figure).stat().st_size > 1000


# Runs in the page once it has loaded (and Material's script has wrapped the tables): for every table
# cell, whether its content overflows the cell, or the cell reaches past the right edge of what is
# visible of the content column (the nearest ancestor that clips or scrolls, else the window). A
# cell hidden behind a horizontal scroll counts as cut: that is how the Default column went missing.
_MEASURE = """
<script>
window.addEventListener("load", function () { setTimeout(function () {
  var out = {width: window.innerWidth, tables: 0, wrapped: 0, cut: []};
  document.querySelectorAll("article table").forEach(function (table, index) {
    out.tables += 1;
    if (table.closest(".md-typeset__scrollwrap")) { out.wrapped += 1; }
    var edge = document.documentElement.clientWidth;
    for (var a = table.parentElement; a; a = a.parentElement) {
      if (["auto", "scroll", "hidden", "clip"].indexOf(getComputedStyle(a).overflowX) >= 0) {
        edge = Math.min(edge, a.getBoundingClientRect().left + a.clientWidth); break;
      }
    }
    table.querySelectorAll("td, th").forEach(function (cell) {
      var right = cell.getBoundingClientRect().right;
      if (cell.scrollWidth > cell.clientWidth + 1 || right > edge + 1) {
        out.cut.push({table: index, cell: cell.textContent.trim().replace(/\\s+/g, " ").slice(0, 50),
                      right: Math.round(right), edge: Math.round(edge)});
      }
    });
  });
  var pre = document.createElement("pre");
  pre.id = "table-measure";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
}, 300); });
</script>
"""


def _chromium() -> str | None:
    import shutil

    return next(
        (found for name in ("chromium", "chromium-browser", "google-chrome", "headless_shell")
         if (found := shutil.which(name))),
        None,
    )  # fmt: skip


@pytest.mark.slow
def test_api_reference_tables_fit_a_1366_px_window(
    built_site: tuple[pathlib.Path, subprocess.CompletedProcess[str]], tmp_path: pathlib.Path
) -> None:
    import json

    browser = _chromium()
    if browser is None:
        pytest.skip("no headless Chromium on PATH (.ci/run apt-installs the chromium package)")
    site, result = built_site
    assert result.returncode == 0, result.stderr[-4000:]
    pages = sorted((site / "reference" / "api").glob("*/index.html"))
    assert len(pages) >= 5, pages
    cut, tables = [], 0
    for page in pages:
        measured = page.with_name("measured.html")  # beside the page: its styles and scripts load
        measured.write_text(
            page.read_text(encoding="utf-8").replace("</body>", _MEASURE + "</body>"), "utf-8"
        )
        dom = subprocess.run(
            [browser, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={tmp_path / 'profile'}",
             "--window-size=1366,768", "--virtual-time-budget=10000", "--dump-dom", measured.as_uri()],
            capture_output=True, text=True, timeout=120, check=False,
        ).stdout  # fmt: skip
        found = re.search(r'<pre id="table-measure">(.*?)</pre>', dom)
        assert found, f"{page}: the measuring script did not run"
        report = json.loads(found.group(1).replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&"))
        assert report["width"] == 1366 and report["tables"] == report["wrapped"] > 0, (page, report)
        tables += report["tables"]
        cut += [f"{page.parent.name}: {each}" for each in report["cut"]]
    assert tables > 100, tables
    assert not cut, "table cells cut at 1366 px:\n" + "\n".join(map(str, cut[:20]))


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
