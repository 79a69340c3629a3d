"""Helpers shared by the whole test suite (and the worker processes the tests start).

The root ``conftest.py`` puts this folder on ``PYTHONPATH`` so a worker process started from any test
folder imports the same helpers. Fixtures built on them live in the root ``conftest.py``.
"""

from __future__ import annotations

import os
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    import subprocess
    from pathlib import Path

    import pytest
    import torch

    from accelerando import Accelerator

# Environment variables that change what an Accelerator or a launch does.
SETTINGS_ENV_PREFIXES = ("ACCELERATE", "ACCELERANDO", "FSDP_", "PET_")


def reset_accelerator_state(*, partial: bool = True) -> None:
    """Forget the process's shared Accelerator and gradient state (the Borg states persist between tests).

    ``partial=False`` keeps the process state (rank, world size, process group): inside a worker of a
    distributed test, to build a second Accelerator on the same group.
    """
    from accelerando.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=partial)
    GradientState._reset_state()


def deepspeed_extensions_folder() -> Path:
    """The tests' own torch-extensions folder for this interpreter (never the user's), kept between runs.

    ``ACCELERANDO_TEST_TORCH_EXTENSIONS_DIR`` when set; otherwise
    ``~/.cache/accelerando/test-torch-extensions/<python>-<key>``, where the key is a hash of the
    interpreter (``sys.prefix``, ``sys.executable``) and the torch version: two virtual environments on
    one machine (a fresh CI one and a developer's) each keep their own build of DeepSpeed's CPU op
    instead of rebuilding it over each other's (1-4 minutes each time on 2 cores).
    """
    import hashlib
    import sys
    from importlib.metadata import PackageNotFoundError, version
    from pathlib import Path

    configured = os.environ.get("ACCELERANDO_TEST_TORCH_EXTENSIONS_DIR")
    if configured:
        return Path(configured)
    try:
        torch_version = version("torch")
    except PackageNotFoundError:
        torch_version = "none"
    identity = f"{sys.prefix}\n{sys.executable}\ntorch {torch_version}"
    key = hashlib.sha256(identity.encode()).hexdigest()[:12]
    python = f"py{sys.version_info[0]}{sys.version_info[1]}"
    return Path.home() / ".cache" / "accelerando" / "test-torch-extensions" / f"{python}-{key}"


def fresh_accelerator(**kwargs: object) -> Accelerator:
    """An Accelerator built after forgetting the shared state (keeps the process group of a worker)."""
    from accelerando import Accelerator

    reset_accelerator_state(partial=False)
    return Accelerator(**kwargs)  # type: ignore[arg-type]


def isolate_settings_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Remove every settings variable from the environment and point the caches into ``tmp_path``.

    A config file or variable on the developer's machine then cannot change what a test sees.
    """
    for key in list(os.environ):
        if key.startswith(SETTINGS_ENV_PREFIXES):
            monkeypatch.delenv(key)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))


def tiny_llama(
    seed: int = 0, *, tied: bool = False, vocab_size: int = 128, layers: int = 2
) -> torch.nn.Module:
    """A small Llama built from a config (no download); ``tied`` shares the embedding with the LM head."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32,
        tie_word_embeddings=tied,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)


class PyrightRun:
    """One ``basedpyright --outputjson`` run with the project's configuration (``[tool.pyright]``)."""

    def __init__(self, *paths: str, niceness: int = 0) -> None:
        import subprocess
        import sys
        import tempfile
        from pathlib import Path

        checker = Path(sys.executable).with_name("basedpyright")
        assert checker.exists(), "basedpyright is missing: pip install -e '.[test]' (it is in the test extra)"
        self._out = tempfile.TemporaryFile(mode="w+")
        self._err = tempfile.TemporaryFile(mode="w+")
        self._proc = subprocess.Popen(
            [str(checker), "--outputjson", "--pythonpath", sys.executable, *paths],
            cwd=Path(__file__).resolve().parents[1],
            stdout=self._out,
            stderr=self._err,
            text=True,
            preexec_fn=(lambda: os.nice(niceness)) if niceness else None,
            start_new_session=True,  # its own process group: stop() ends the wrapper and its node child
        )

    def report(self, timeout: float = 1500) -> dict[str, Any]:
        """Wait for the run; its JSON report."""
        import json

        self._proc.wait(timeout=timeout)
        self._out.seek(0)
        self._err.seek(0)
        stdout = self._out.read()
        assert stdout, self._err.read()
        return json.loads(stdout)

    def stop(self) -> None:
        import signal

        if self._proc.poll() is None:
            os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait()
        self._out.close()
        self._err.close()


# ------------------------------------------------- multi-process checks forked from preloaded libraries
# A 2-process check started with ``run_distributed`` spends most of its time in each fresh interpreter
# importing torch, torch._dynamo (which the first optimizer imports) and the test's libraries: 5-10 s
# per launch on 2 cores, before any check runs. ``run_distributed_preloaded`` starts the same real gloo
# processes (one per rank, the torchrun environment, the same result and failure reporting) by forking
# them from a fork server that imported those libraries once for the session, as the checkpoint tests'
# workers already are. Only for checks of what a run does, not of how a fresh interpreter starts: the
# fork server imported torch before the rank's environment existed, so variables read at start-up
# (MALLOC_*, LD_*, a library's import-time settings) and import counts keep ``run_distributed``. The
# environment of the test at call time (what spawn would have passed) is given to each rank, and
# torch's thread count follows its OMP_NUM_THREADS, as a fresh interpreter's would.
FORKSERVER_PRELOAD = ["torch", "torch._dynamo", "torch.optim", "torch.distributed", "safetensors.torch"]


def _preloaded_rank_main(
    parent_pid: int, environ: dict[str, str], call: bytes, rank: int, *rank_args: Any
) -> None:
    """Give the forked rank what a spawned one starts with (the test process's current standard output and
    error, where pytest captures them, and its environment), then run it as ``run_distributed``. ``call``:
    the pickled function and arguments, loaded here, after the redirection (loading imports the test's
    module, which may print)."""
    import pickle
    import warnings

    import torch

    from accelerando.test_utils.distributed import _rank_main

    for fd in (1, 2):  # a forked rank inherits the fork server's, not the test's
        try:
            target = os.open(f"/proc/{parent_pid}/fd/{fd}", os.O_WRONLY | os.O_APPEND)
        except OSError:
            continue
        os.dup2(target, fd)
        os.close(target)
    os.environ.clear()
    os.environ.update(environ)
    if os.environ.get("PYTHONWARNINGS"):  # what the interpreter does at start-up with the variable
        warnings._processoptions(os.environ["PYTHONWARNINGS"].split(","))  # type: ignore[attr-defined]
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    world_size, port, env, results, stack_file = rank_args
    try:
        fn, args = pickle.loads(call)
    except BaseException:  # noqa: BLE001 - the parent must hear of it, as of any failure
        import traceback

        results.put((rank, False, traceback.format_exc()))
        return
    _rank_main(fn, rank, world_size, port, env, args, results, stack_file)


def start_fork_server() -> None:
    """Start the session's fork server now (it imports ``FORKSERVER_PRELOAD`` in the background)."""
    import multiprocessing as mp
    from multiprocessing import forkserver

    mp.get_context("forkserver").set_forkserver_preload(FORKSERVER_PRELOAD)
    forkserver.ensure_running()


def run_distributed_preloaded(
    fn: Any, world_size: int = 2, *args: object, env: dict[str, str] | None = None, timeout: float = 240.0
) -> list[Any]:
    """``accelerando.test_utils.run_distributed`` with the ranks forked from a preloaded fork server."""
    import multiprocessing as mp
    import pickle
    import tempfile

    from accelerando.test_utils.distributed import _run_ranks, get_free_port

    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(FORKSERVER_PRELOAD)  # used when the session's fork server starts
    results = ctx.Queue()
    port = get_free_port()
    # The rank's own variables go in before it starts (run_distributed's ranks set them before any work).
    environ = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), **(env or {})}
    call = pickle.dumps((fn, args))
    stack_dir = tempfile.TemporaryDirectory(prefix="run_distributed_stacks_")
    stack_files = [os.path.join(stack_dir.name, f"rank{rank}.txt") for rank in range(world_size)]
    procs = [
        ctx.Process(
            target=_preloaded_rank_main,
            args=(
                os.getpid(),
                environ,
                call,
                rank,
                world_size,
                port,
                dict(env or {}),
                results,
                stack_files[rank],
            ),
        )
        for rank in range(world_size)
    ]
    return _run_ranks(procs, results, stack_dir, stack_files, timeout)


# ------------------------------------------------------------------ fresh-interpreter probes started together
class ConcurrentProbes:
    """A test module's independent fresh-interpreter probes, started together by a module fixture.

    Each probe is one process that mostly imports, on one core; the suite runs one test at a time and
    leaves the second core idle, so probes started together take about the longest one's time instead
    of the sum. Each test reads its own probe's completed process (``result``): the same command, the
    same environment, the same checks as a ``subprocess.run`` in the test. Only the probes of the tests
    selected in this session start. Output goes to temporary files (a pipe nobody reads yet could fill).

    ``commands``: test name (``test_x``, or ``test_x[case]`` for one case of a parametrized test) ->
    ``subprocess.Popen`` keyword arguments (``args``, ``env``...).
    """

    def __init__(self, request: pytest.FixtureRequest, commands: dict[str, dict[str, Any]]) -> None:
        import subprocess
        import tempfile

        module = request.module
        selected = set()  # a test's name, and a parametrized test's name with and without its case
        for item in request.session.items:
            if getattr(item, "module", None) is module:
                selected.update({item.name, getattr(item, "originalname", item.name)})
        self._running: dict[
            str, tuple[subprocess.Popen[str] | subprocess.Popen[bytes], IO[bytes], IO[bytes]]
        ] = {}
        for name, popen_kwargs in commands.items():
            if name not in selected:
                continue
            out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
            self._running[name] = (subprocess.Popen(stdout=out, stderr=err, **popen_kwargs), out, err)

    def result(self, name: str, timeout: float = 300.0) -> subprocess.CompletedProcess[str]:
        """The finished probe of test ``name`` (``subprocess.TimeoutExpired`` past ``timeout`` seconds)."""
        import subprocess

        proc, out, err = self._running[name]
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
        texts = []
        for handle in (out, err):
            handle.seek(0)
            texts.append(handle.read().decode(errors="replace"))
        return subprocess.CompletedProcess(proc.args, proc.returncode, texts[0], texts[1])

    def close(self) -> None:
        for proc, out, err in self._running.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            out.close()
            err.close()
