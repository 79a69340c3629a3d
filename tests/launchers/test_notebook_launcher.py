"""notebook_launcher / debug_launcher: real processes on CPU, and one real Jupyter notebook."""

from __future__ import annotations

import os

import pytest

from accelerando.launchers import debug_launcher, notebook_launcher
from accelerando.launchers.notebook import LaunchedFunctionError


@pytest.fixture(autouse=True)
def fresh_parent_state():
    """Other tests in the same session may leave a PartialState behind; launching refuses that."""
    from accelerando.state import PartialState

    PartialState._reset_state()
    yield
    PartialState._reset_state()


def _train_and_report(steps: int):
    import torch

    from accelerando.core.settings import resolve_runtime_settings
    from accelerando.state import PartialState
    from accelerando.test_utils import RegressionDataset

    state = PartialState()
    data = RegressionDataset(length=16, seed=0)
    x, y = torch.from_numpy(data.x), torch.from_numpy(data.y)
    w = torch.zeros(2, requires_grad=True)
    for _ in range(steps):
        shard = slice(state.process_index, None, state.num_processes)
        loss = ((x[shard] * w[0] + w[1] - y[shard]) ** 2).mean()
        loss.backward()
        torch.distributed.all_reduce(w.grad)
        with torch.no_grad():
            w -= 0.1 * w.grad / state.num_processes
            w.grad.zero_()
    precision = resolve_runtime_settings().mixed_precision
    return state.process_index, state.num_processes, str(state.device), w.tolist(), precision


def _fail_on_rank_one():
    if int(os.environ["RANK"]) == 1:
        raise ZeroDivisionError("rank one cannot divide")
    return "ok"


def test_notebook_launcher_two_cpu_processes_train_and_return():
    results = notebook_launcher(_train_and_report, args=(3,), num_processes=2, mixed_precision="bf16")
    assert [r[:3] for r in results] == [(0, 2, "cpu"), (1, 2, "cpu")]
    assert results[0][3] == results[1][3]  # same weights everywhere after the all-reduced steps
    assert results[0][3] != [0.0, 0.0]
    assert {r[4] for r in results} == {"bf16"}
    assert "ACCELERANDO_MIXED_PRECISION" not in os.environ  # set only for the launch


def test_worker_exception_surfaces_with_traceback_and_debug_launcher():
    with pytest.raises(LaunchedFunctionError) as info:
        debug_launcher(_fail_on_rank_one, num_processes=2)
    message = str(info.value)
    assert "Process 1" in message and "ZeroDivisionError: rank one cannot divide" in message
    assert "_fail_on_rank_one" in message  # the traceback, not just the message
    assert notebook_launcher(lambda a: a * 2, args=(21,), num_processes=1) == 42  # one process: in-process
    with pytest.raises(ValueError, match="mixed_precision"):
        notebook_launcher(_fail_on_rank_one, num_processes=2, mixed_precision="fp12")
    with pytest.raises(ValueError, match="num_processes"):
        debug_launcher(_fail_on_rank_one, num_processes=0)


def _rank_times(factor: int) -> int:
    return int(os.environ["RANK"]) * factor


def test_debug_launcher_runs_a_partial():
    """A functools.partial has no __name__, which the elastic agent reads; it runs all the same."""
    import functools

    assert debug_launcher(functools.partial(_rank_times, factor=10), num_processes=2) == [0, 10]


NOTEBOOK_CELL = """\
from accelerando import notebook_launcher

def training_function(scale):
    import torch
    from accelerando.state import PartialState
    state = PartialState()
    total = torch.tensor([float(state.process_index + 1) * scale])
    torch.distributed.all_reduce(total)
    return state.process_index, state.num_processes, total.item()

results = notebook_launcher(training_function, args=(10,), num_processes=2)
print("RESULTS", results)
"""


def test_real_notebook_runs_notebook_launcher(tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    notebook = nbformat.v4.new_notebook()
    notebook.cells.append(nbformat.v4.new_code_cell(NOTEBOOK_CELL))
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    client = nbclient.NotebookClient(
        notebook, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()
    outputs = "".join(
        o.get("text", "") for o in notebook.cells[0].outputs if o.get("output_type") == "stream"
    )
    assert "RESULTS [(0, 2, 30.0), (1, 2, 30.0)]" in outputs, outputs


def test_launch_refused_when_state_exists_in_parent():
    from accelerando.state import PartialState

    PartialState(cpu=True)
    try:
        with pytest.raises(ValueError, match="inside the launched function"):
            notebook_launcher(_fail_on_rank_one, num_processes=2)
    finally:
        PartialState._reset_state()


def test_launch_refused_when_cuda_is_initialised_in_parent(monkeypatch):
    # The trigger is hardware state this CPU machine cannot reach; report it as a CUDA process would.
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    with pytest.raises(ValueError, match="move every CUDA call .* into the launched function"):
        notebook_launcher(_fail_on_rank_one, num_processes=2)
