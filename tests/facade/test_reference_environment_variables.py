"""Reference variables read at process start or by helpers: each one changes behaviour."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from torch import nn

from suite_support import ConcurrentProbes


class _WithBuffer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(2, 2)
        self.register_buffer("scale", torch.ones(2))


# ------------------------------------------------------------------------------ init_include_buffers
def test_init_include_buffers_setting_is_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    from accelerando.big_modeling import init_empty_weights

    monkeypatch.delenv("ACCELERATE_INIT_INCLUDE_BUFFERS", raising=False)
    with init_empty_weights():
        model = _WithBuffer()
    assert model.linear.weight.is_meta and not model.scale.is_meta
    monkeypatch.setenv("ACCELERATE_INIT_INCLUDE_BUFFERS", "true")
    with init_empty_weights():
        model = _WithBuffer()
    assert model.linear.weight.is_meta and model.scale.is_meta
    with init_empty_weights(include_buffers=False):  # an explicit argument wins
        model = _WithBuffer()
    assert not model.scale.is_meta


# ------------------------------------------------------------------------------ process start
@pytest.mark.usefixtures("fresh_state")
@pytest.mark.parametrize("variable", ["ACCELERATE_USE_SAGEMAKER", "ACCELERATE_IN_TPU_POD"])
def test_sagemaker_and_tpu_pod_are_refused_at_process_start(
    monkeypatch: pytest.MonkeyPatch, variable: str
) -> None:
    from accelerando.state import PartialState

    monkeypatch.setenv(variable, "true")
    with pytest.raises(ValueError, match=variable):
        PartialState()
    monkeypatch.setenv(variable, "false")
    assert PartialState().num_processes == 1


@pytest.mark.usefixtures("fresh_state")
def test_torch_device_names_the_process_device(monkeypatch: pytest.MonkeyPatch) -> None:
    from accelerando.core import runtime
    from accelerando.core.devices import CPUBackend, CUDABackend
    from accelerando.state import PartialState

    monkeypatch.delenv("ACCELERATE_TORCH_DEVICE", raising=False)
    assert runtime._process_device(True, 0) == (CPUBackend, torch.device("cpu"))
    monkeypatch.setattr(CUDABackend, "is_available", classmethod(lambda cls: True))
    monkeypatch.setenv("ACCELERATE_TORCH_DEVICE", "cuda:3")
    assert runtime._process_device(True, 0) == (CUDABackend, torch.device("cuda", 3))
    monkeypatch.setattr(CUDABackend, "is_available", classmethod(lambda cls: False))
    with pytest.raises(ValueError, match="none is available"):
        PartialState()
    monkeypatch.setenv("ACCELERATE_TORCH_DEVICE", "not-a-device")
    with pytest.raises(ValueError, match="not a torch device"):
        runtime._process_device(False, 0)
    monkeypatch.setenv("ACCELERATE_TORCH_DEVICE", "cpu")
    assert PartialState().device == torch.device("cpu")


def _default_store_kind() -> str:
    import torch.distributed as dist

    from accelerando.state import PartialState

    state = PartialState()
    store = dist.distributed_c10d._world.pg_map[dist.group.WORLD][1]
    while hasattr(store, "underlying_store"):
        store = store.underlying_store
    state.wait_for_everyone()
    return type(store).__name__


@pytest.mark.slow
def test_debug_rdv_file_is_the_rendezvous(tmp_path) -> None:
    from accelerando.test_utils.distributed import run_distributed

    kinds = run_distributed(
        _default_store_kind,
        2,
        env={"ACCELERATE_DEBUG_RDV_FILE": str(tmp_path / "rdv"), "ACCELERANDO_USE_CPU": "1"},
    )
    assert kinds == ["FileStore", "FileStore"]


# ------------------------------------------------------------------------------ enable_rich
_RICH_PROBE = (
    "import sys, accelerando\n"
    "before = sys.excepthook.__module__\n"
    "assert 'rich' not in sys.modules, 'import accelerando must not import rich'\n"
    "from accelerando.state import PartialState\n"
    "PartialState()\n"
    "print(before, sys.excepthook.__module__)\n"
)


_RICH_ON_IMPORT = "import sys, accelerando.utils.rich; print(sys.excepthook.__module__)"


@pytest.fixture(scope="module")
def rich_probes(request: pytest.FixtureRequest) -> Iterator[ConcurrentProbes]:
    """The three fresh interpreters below, started together (each test checks its own)."""
    import os
    import sys

    commands = {
        f"test_enable_rich_installs_rich_tracebacks_at_process_start[{value}-{expected}]": {
            "args": [sys.executable, "-c", _RICH_PROBE],
            "env": {**os.environ, "ACCELERATE_ENABLE_RICH": value},
        }
        for value, expected in (("false", "sys"), ("true", "rich.traceback"))
    }
    commands["test_utils_rich_module_installs_on_import"] = {"args": [sys.executable, "-c", _RICH_ON_IMPORT]}
    running = ConcurrentProbes(request, commands)
    try:
        yield running
    finally:
        running.close()


@pytest.mark.parametrize(("value", "expected"), [("false", "sys"), ("true", "rich.traceback")])
def test_enable_rich_installs_rich_tracebacks_at_process_start(
    rich_probes: ConcurrentProbes, value: str, expected: str
) -> None:
    pytest.importorskip("rich")
    out = rich_probes.result(
        f"test_enable_rich_installs_rich_tracebacks_at_process_start[{value}-{expected}]"
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["sys", expected]


def test_utils_rich_module_installs_on_import(rich_probes: ConcurrentProbes) -> None:
    pytest.importorskip("rich")
    out = rich_probes.result("test_utils_rich_module_installs_on_import")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "rich.traceback"
