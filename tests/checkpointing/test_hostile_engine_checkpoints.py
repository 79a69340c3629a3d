"""Sharded strategies' own checkpoint files are read without running code from them too.

- DeepSpeed engine checkpoints (ZeRO 1 and 3) resume without the opt-in, and a malicious engine file
  (optimizer states under ZeRO 1, model states under ZeRO 3, with a manifest that checks out) runs
  nothing. One process launch (deepspeed import + engine builds cost seconds): every check runs in it.
- FSDP's sharded folders (torch.distributed.checkpoint): the ``.metadata`` pickle, which DCP itself
  reads with a plain ``pickle.load``, is read through an allowlist, and the shard files it names must
  be inside the folder (checked here without processes: DCP loads without a process group).
"""

from __future__ import annotations

import os
import shlex
import warnings
from typing import Any

import pytest

from accelerando.common.imports import is_deepspeed_available
from suite_support import reset_accelerator_state

pytestmark = pytest.mark.skipif(
    not is_deepspeed_available(), reason="needs deepspeed (pip install deepspeed)"
)

ENV = {"OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu", "PYTHONWARNINGS": "ignore"}


class Payload:
    def __init__(self, canary: str) -> None:
        self.canary = canary

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {shlex.quote(self.canary)}",))


def _engine(stage: int) -> tuple[Any, ...]:
    import torch

    from accelerando import Accelerator, DeepSpeedPlugin

    reset_accelerator_state(partial=False)
    accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=stage))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.Tanh(), torch.nn.Linear(12, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(torch.randn(8, 6), batch_size=4)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    return accelerator, model, optimizer, loader


def _resign(folder: str) -> None:
    import json

    from accelerando.checkpointing.digest import file_digest
    from accelerando.checkpointing.manifest import MANIFEST_NAME

    path = os.path.join(folder, MANIFEST_NAME)
    with open(path, encoding="utf-8") as handle:
        payload = json.load(handle)
    for name in payload["files"]:
        entry = file_digest(os.path.join(folder, name))
        payload["files"][name] = {
            "size": entry.size,
            "checksum": entry.checksum,
            "algorithm": entry.algorithm,
        }
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(payload, handle)


def _per_rank(tmp: str) -> dict[str, Any]:
    import torch

    from accelerando.checkpointing.files import UnsafeCheckpointError

    out: dict[str, Any] = {}
    for stage, kind in ((1, "optim_states"), (3, "model_states")):
        accelerator, model, optimizer, loader = _engine(stage)
        for batch in loader:
            accelerator.backward(model(batch).sum())
            optimizer.step()
            optimizer.zero_grad()
        folder = accelerator.save_state(os.path.join(tmp, f"zero{stage}"))
        saved = {k: v.clone() for k, v in accelerator.get_state_dict(model).items()}
        accelerator._strategy.release()
        fresh, model, *_ = _engine(stage)
        fresh.load_state(folder)  # weights-only: DeepSpeed's own types are accepted, nothing else
        loaded = fresh.get_state_dict(model)
        out[f"zero{stage}_resumed"] = all(torch.equal(saved[k], loaded[k]) for k in saved)
        fresh._strategy.release()
        engine_files = sorted(
            n for n in os.listdir(os.path.join(folder, "pytorch_model")) if n.endswith(".pt")
        )
        out[f"zero{stage}_files"] = engine_files
        for name in [n for n in engine_files if kind in n][:1]:
            canary = os.path.join(tmp, f"canary_{stage}_{name}")
            path = os.path.join(folder, "pytorch_model", name)
            original = open(path, "rb").read()
            torch.save({"module": Payload(canary)}, path)
            _resign(folder)
            fresh, *_ = _engine(stage)
            try:
                fresh.load_state(folder)
                out[f"zero{stage}:{name}"] = "loaded"
            except UnsafeCheckpointError as err:
                out[f"zero{stage}:{name}"] = str(err)
            fresh._strategy.release()
            out[f"zero{stage}:{name}:ran"] = os.path.exists(canary)
            with open(path, "wb") as handle:
                handle.write(original)
            _resign(folder)
    return out


@pytest.mark.slow
@pytest.mark.skipif(not is_deepspeed_available(), reason="needs deepspeed (pip install deepspeed)")
@pytest.mark.usefixtures("deepspeed_cpu_op")
def test_deepspeed_engine_files_are_read_weights_only(tmp_path) -> None:
    from accelerando.test_utils import run_distributed

    out = run_distributed(_per_rank, 1, str(tmp_path), env=ENV)[0]
    for stage, kind in ((1, "optim_states"), (3, "model_states")):
        assert out[f"zero{stage}_resumed"], out
        files = out[f"zero{stage}_files"]
        assert any("optim_states" in n for n in files) and any("model_states" in n for n in files), files
        for name in [n for n in files if kind in n][:1]:
            message = out[f"zero{stage}:{name}"]
            assert not out[f"zero{stage}:{name}:ran"], f"code ran from {name}"
            assert name in message and "system" in message and "weights_only" in message, message


def _dcp_folder(tmp_path: Any) -> tuple[str, dict[str, Any]]:
    import torch
    import torch.distributed.checkpoint as dcp

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    folder = str(tmp_path / "pytorch_model_fsdp_0")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DCP warns that no process group exists
        dcp.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, checkpoint_id=folder)
    return folder, {"model": model.state_dict(), "optimizer": optimizer.state_dict()}


def _dcp_load(folder: str, template: dict[str, Any]) -> dict[str, Any]:
    import torch
    import torch.distributed.checkpoint as dcp

    from accelerando.backends.strategies.fsdp.state import _shard_reader

    state = {
        "model": {k: torch.zeros_like(v) for k, v in template["model"].items()},
        "optimizer": template["optimizer"],
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(state, storage_reader=_shard_reader(folder))
    return state


def test_fsdp_shard_metadata_is_read_through_an_allowlist(tmp_path) -> None:
    import pickle

    import torch

    from accelerando.checkpointing.files import UnsafeCheckpointError
    from accelerando.checkpointing.manifest import CheckpointError

    folder, saved = _dcp_folder(tmp_path)
    loaded = _dcp_load(folder, saved)
    assert all(torch.equal(loaded["model"][k], v) for k, v in saved["model"].items())
    metadata_path = os.path.join(folder, ".metadata")
    with open(metadata_path, "rb") as handle:
        metadata = pickle.load(handle)  # the test's own file: trusted
    info = next(iter(metadata.storage_data.values()))
    info.relative_path = "../outside.distcp"
    with open(metadata_path, "wb") as handle:
        pickle.dump(metadata, handle)
    with pytest.raises(
        CheckpointError, match=r"\.metadata.*'\.\./outside\.distcp' is not a plain relative name"
    ):
        _dcp_load(folder, saved)
    canary = tmp_path / "canary"
    with open(metadata_path, "wb") as handle:
        pickle.dump(Payload(str(canary)), handle)
    with pytest.raises(UnsafeCheckpointError, match=r"\.metadata.*system"):
        _dcp_load(folder, saved)
    assert not canary.exists()
