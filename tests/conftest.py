"""Fixtures shared by the test modules."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from suite_support import (
    PyrightRun,
    deepspeed_extensions_folder,
    isolate_settings_environment,
    reset_accelerator_state,
    run_distributed_preloaded,
    start_fork_server,
)

# Worker processes started by a test import the shared helpers too, from whatever folder the test is in.
_TESTS_FOLDER = str(Path(__file__).resolve().parent)
if _TESTS_FOLDER not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (_TESTS_FOLDER, os.environ.get("PYTHONPATH")) if p)


@pytest.fixture
def fresh_state() -> Iterator[None]:
    """Forget every Accelerator/process state before and after the test (the Borg states persist).

    The one fixture that resets state; a worker process calls ``suite_support.reset_accelerator_state``.
    """
    reset_accelerator_state()
    yield
    reset_accelerator_state()


@pytest.fixture
def isolated_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No ACCELERATE*/ACCELERANDO*/FSDP_*/PET_* variable from the machine, caches inside ``tmp_path``."""
    isolate_settings_environment(monkeypatch, tmp_path)


def _remove_stale_build_locks(folder: Path, older_than_s: float = 1800.0) -> None:
    """Delete torch-extension build locks left by a killed build (torch would wait on them forever).

    A lock is stale when it is older than any build takes here and its op's library already exists.
    """
    import time

    for lock in folder.glob("*/lock"):
        if time.time() - lock.stat().st_mtime > older_than_s and any(lock.parent.glob("*.so")):
            lock.unlink(missing_ok=True)


@pytest.fixture(scope="session")
def deepspeed_cpu_op(request: pytest.FixtureRequest) -> Path:
    """Build DeepSpeed's CPU shared-memory communication op once, before any DeepSpeed process starts.

    Every process of a CPU DeepSpeed run loads this op; unbuilt, each one compiles it (about 2 minutes
    on 2 cores), concurrently, and a multi-process test times out waiting. The build goes to a private
    folder per interpreter (``ACCELERANDO_TEST_TORCH_EXTENSIONS_DIR``, default
    ``~/.cache/accelerando/test-torch-extensions/<python>-<key>``: ``suite_support.deepspeed_extensions_folder``),
    exported as ``TORCH_EXTENSIONS_DIR`` for every process the tests start. Returns that folder.

    Fails the requesting test (with the compiler's last output lines and the fix) when the build fails.
    """
    if importlib.util.find_spec("deepspeed") is None:  # not importorskip: importing DeepSpeed takes seconds
        pytest.skip("needs deepspeed (pip install deepspeed)")
    folder = deepspeed_extensions_folder()
    folder.mkdir(parents=True, exist_ok=True)
    _remove_stale_build_locks(folder)
    os.environ["TORCH_EXTENSIONS_DIR"] = str(folder)
    stamp = folder / "deepspeed_shm_comm.loaded-by"
    key = _deepspeed_op_key(folder)
    if key and stamp.is_file() and stamp.read_text() == key and not any(folder.glob("*/lock")):
        return folder  # this interpreter loaded this very library last time: nothing would be rebuilt
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None and not any(folder.rglob("*.so")):
        reporter.write_line(
            f"building DeepSpeed's CPU communication op once into {folder} (about 2 minutes on 2 cores)"
        )
    build = subprocess.run(
        [
            sys.executable,
            "-c",
            "from deepspeed.ops.op_builder.cpu import ShareMemCommBuilder; ShareMemCommBuilder().load()",
        ],
        env={**os.environ, "DS_ACCELERATOR": "cpu"},
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    if build.returncode != 0:
        tail = "\n".join((build.stdout + build.stderr).splitlines()[-15:])
        pytest.fail(
            f"could not build DeepSpeed's CPU communication op into {folder} (exit {build.returncode}); "
            f"a C++ compiler and Python headers are needed (Debian: apt-get install g++ python3-dev):\n{tail}",
            pytrace=False,
        )
    stamp.write_text(_deepspeed_op_key(folder))
    return folder


def _deepspeed_op_key(folder: Path) -> str:
    """What a load of the op depends on: the interpreter, torch, DeepSpeed, and the library's file.

    When it is unchanged since this interpreter last loaded the op, a load would find the library up to
    date (ninja compares its commands and sources, which these versions fix), so the fixture skips the
    load's subprocess (importing DeepSpeed alone takes seconds). Any other build into the folder (another
    interpreter, other versions) rewrites the library, changes the key, and the load runs again.
    """
    from importlib.metadata import version

    library = folder / "deepspeed_shm_comm" / "deepspeed_shm_comm.so"
    if not library.is_file():
        return ""
    built = library.stat()
    return (
        f"{sys.executable} torch {version('torch')} deepspeed {version('deepspeed')} "
        f"{built.st_size} {built.st_mtime_ns}\n"
    )


# ------------------------------------------------------------------ pyright over src/, in the background
# tests/runtime/test_typing_contracts.py runs basedpyright in basic mode over all of src/: about 100 s of
# one core, most of it binding torch and the other libraries src/ imports. The rest of the suite leaves
# one of the 2 cores idle most of the time (it is serial, and a launch mostly waits), so the whole-tree
# run starts in the background, at low priority, as soon as the collected tests include that test, and
# the test reads its report when its turn comes. The check is the same pyright run over the same tree.
PYRIGHT_OVER_SRC_TEST = "tests/runtime/test_typing_contracts.py::test_pyright_basic_over_src_does_not_grow"

_pyright_over_src: dict[str, PyrightRun] = {}


def pytest_collection_finish(session: pytest.Session) -> None:
    if session.config.option.collectonly:
        return
    if any(item.nodeid == PYRIGHT_OVER_SRC_TEST for item in session.items):
        _pyright_over_src["run"] = PyrightRun(niceness=10)
    # The fork server of run_distributed_preloaded imports torch in the background while the first
    # tests run, when any collected test module launches through it.
    modules = {getattr(item, "module", None) for item in session.items}
    if any(
        getattr(module, "run_distributed_preloaded", None) is run_distributed_preloaded for module in modules
    ):
        start_fork_server()


def pytest_sessionfinish(session: pytest.Session) -> None:
    run = _pyright_over_src.pop("run", None)
    if run is not None:
        run.stop()


@pytest.fixture(scope="session")
def pyright_report_over_src() -> dict:
    """basedpyright's JSON report over all of src/ (started at collection when this run needs it)."""
    run = _pyright_over_src.pop("run", None) or PyrightRun()
    try:
        return run.report()
    finally:
        run.stop()
