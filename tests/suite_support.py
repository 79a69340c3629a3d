"""Helpers shared by the whole test suite (and the worker processes the tests start).

The root ``conftest.py`` puts this folder on ``PYTHONPATH`` so a worker process started from any test
folder imports the same helpers. Fixtures built on them live in the root ``conftest.py``.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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
