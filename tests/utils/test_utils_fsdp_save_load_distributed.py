"""utils.fsdp_utils save/load of FSDP2 models and optimizers in two real gloo processes.

One launch checks FULL_STATE_DICT and SHARDED_STATE_DICT round trips (weights and optimizer state
come back exactly, in a freshly prepared model), the shard-folder form of ``input_dir``, and the
clear errors; the parent compares what the ranks report.
"""

from __future__ import annotations

import os

import pytest
import torch

from accelerando.test_utils import run_distributed
from suite_support import reset_accelerator_state


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def _prepared(kind: str, seed: int):
    from accelerando import Accelerator, FullyShardedDataParallelPlugin

    reset_accelerator_state(partial=False)
    plugin = FullyShardedDataParallelPlugin(
        state_dict_type=kind, auto_wrap_policy="SIZE_BASED_WRAP", min_num_params=1
    )
    acc = Accelerator(fsdp_plugin=plugin)
    model = _model(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    model, optimizer = acc.prepare(model, optimizer)
    return acc, plugin, model, optimizer


def _step(acc, model, optimizer) -> None:
    data = torch.randn(4, 8, generator=torch.Generator().manual_seed(acc.process_index))
    acc.backward(model(data).pow(2).mean())
    optimizer.step()
    optimizer.zero_grad()


def _full(acc, model) -> dict:
    return {k: v.clone() for k, v in acc.get_state_dict(model).items()}


def _worker(root: str) -> dict:
    from accelerando.utils.fsdp_utils import (
        load_fsdp_model,
        load_fsdp_optimizer,
        save_fsdp_model,
        save_fsdp_optimizer,
    )

    out: dict = {}
    for kind in ("FULL_STATE_DICT", "SHARDED_STATE_DICT"):
        folder = os.path.join(root, kind)
        acc, plugin, model, optimizer = _prepared(kind, seed=0)
        _step(acc, model, optimizer)
        written = save_fsdp_model(plugin, acc, model, folder)
        opt_written = save_fsdp_optimizer(plugin, acc, optimizer, model, folder, optimizer_index=1)
        acc.wait_for_everyone()
        saved = _full(acc, model)
        _step(acc, model, optimizer)  # the reference continuation after the save
        continued = _full(acc, model)

        acc2, plugin2, model2, optimizer2 = _prepared(kind, seed=1)  # different weights
        source = written if kind == "SHARDED_STATE_DICT" else folder  # both input_dir forms
        load_fsdp_model(plugin2, acc2, model2, source)
        load_fsdp_optimizer(plugin2, acc2, optimizer2, model2, folder, optimizer_index=1)
        loaded = _full(acc2, model2)
        _step(acc2, model2, optimizer2)
        resumed = _full(acc2, model2)
        same = lambda a, b: a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # noqa: E731
        out[kind] = {
            "written": os.path.relpath(written, root),
            "optimizer_written": os.path.relpath(opt_written, root),
            "weights_equal": same(saved, loaded) if acc.is_main_process else None,
            "resume_equal": same(continued, resumed) if acc.is_main_process else None,
        }
    try:
        save_fsdp_model(plugin, acc, model, root, use_dcp=False)
    except ValueError as error:
        out["no_dcp_error"] = str(error)
    try:
        load_fsdp_model(plugin, acc, model, os.path.join(root, "nothing"))
    except FileNotFoundError as error:
        out["missing_error"] = str(error)
    return out


@pytest.mark.slow
def test_fsdp_utils_save_and_load_round_trip(tmp_path):
    results = run_distributed(_worker, 2, str(tmp_path), timeout=280)
    main, other = results
    assert main["FULL_STATE_DICT"]["written"] == "FULL_STATE_DICT/pytorch_model_fsdp.bin"
    assert main["FULL_STATE_DICT"]["optimizer_written"] == "FULL_STATE_DICT/optimizer_1.bin"
    assert main["SHARDED_STATE_DICT"]["written"] == "SHARDED_STATE_DICT/pytorch_model_fsdp_0"
    assert main["SHARDED_STATE_DICT"]["optimizer_written"] == "SHARDED_STATE_DICT/optimizer_1"
    for kind in ("FULL_STATE_DICT", "SHARDED_STATE_DICT"):
        assert main[kind]["weights_equal"] is True, kind
        assert main[kind]["resume_equal"] is True, kind  # the optimizer state came back too
    assert sorted(os.listdir(tmp_path / "FULL_STATE_DICT")) == ["optimizer_1.bin", "pytorch_model_fsdp.bin"]
    assert "use_dcp=True" in main["no_dcp_error"] and "use_dcp=True" in other["no_dcp_error"]
    assert "pytorch_model_fsdp_0" in main["missing_error"]
