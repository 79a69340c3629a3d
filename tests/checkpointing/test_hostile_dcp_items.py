"""Issue 27, hole 1: no code runs from the shard files of an FSDP sharded checkpoint.

torch's default DCP load planner reads every non-tensor item (an optimizer's ``param_groups.0.lr``)
with ``torch.load(weights_only=False)``. An attacker appends a pickle payload to
``optimizer_0/__0_0.distcp``, points that item of a well-formed ``.metadata`` at it and re-signs the
manifest: the load must refuse (``UnsafeCheckpointError``) without running the payload, on every DCP
read path (``load_state`` through the strategy, ``merge_fsdp_weights``), and a clean checkpoint must
still load bitwise. The checkpoint is a real one, saved by two gloo CPU processes with FSDP.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import shlex
from typing import Any

import pytest
import torch

from suite_support import reset_accelerator_state, run_distributed_preloaded

ENV = {"OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
ITEM = "optimizer.param_groups.0.lr"


class Payload:
    """Unpickling it creates the canary file (through ``os.system``)."""

    def __init__(self, canary: str) -> None:
        self.canary = canary

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {shlex.quote(self.canary)}",))


def _resign(folder: str) -> None:
    """Rewrite the manifest's sizes and checksums, as an attacker with write access would."""
    from accelerando.checkpointing.digest import file_digest
    from accelerando.checkpointing.manifest import MANIFEST_NAME

    path = os.path.join(folder, MANIFEST_NAME)
    with open(path, encoding="utf-8") as handle:
        manifest = json.load(handle)
    for name in manifest["files"]:
        entry = file_digest(os.path.join(folder, name))
        manifest["files"][name] = {
            "size": entry.size,
            "checksum": entry.checksum,
            "algorithm": entry.algorithm,
        }
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(manifest, handle)


def plant(shards: str, canary: str, item: str = ITEM) -> None:
    """Append a pickle payload to ``__0_0.distcp`` and point ``item`` of ``.metadata`` at it."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo

    buffer = io.BytesIO()
    torch.save(Payload(canary), buffer)
    payload = buffer.getvalue()
    shard = os.path.join(shards, "__0_0.distcp")
    offset = os.path.getsize(shard)
    with open(shard, "ab") as handle:
        handle.write(payload)
    metadata_path = os.path.join(shards, ".metadata")
    with open(metadata_path, "rb") as handle:
        metadata = pickle.load(handle)  # the test's own file: trusted
    keys = [key for key in metadata.storage_data if key.fqn == item]
    assert keys, sorted(k.fqn for k in metadata.storage_data)
    for key in keys:
        metadata.storage_data[key] = _StorageInfo("__0_0.distcp", offset, len(payload))
    with open(metadata_path, "wb") as handle:
        pickle.dump(metadata, handle)  # plain data only: the metadata check accepts it


def _setup() -> tuple[Any, Any, Any]:
    from accelerando import Accelerator, FullyShardedDataParallelPlugin

    reset_accelerator_state(partial=False)
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, state_dict_type="SHARDED_STATE_DICT")
    accelerator = Accelerator(fsdp_plugin=plugin)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    model, optimizer = accelerator.prepare(model, optimizer)
    return accelerator, model, optimizer


def _local(state: Any, prefix: str = "") -> dict[str, Any]:
    """Flat ``name -> value`` of a nested state dict, DTensors as their local shards."""
    out: dict[str, Any] = {}
    items = (
        state.items() if isinstance(state, dict) else enumerate(state) if isinstance(state, list) else None
    )
    if items is None:
        return {prefix: state.to_local() if hasattr(state, "to_local") else state}
    for key, value in items:
        out.update(_local(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    if set(a) != set(b):
        return False
    for key, value in a.items():
        other = b[key]
        if isinstance(value, torch.Tensor):
            if not (
                isinstance(other, torch.Tensor) and value.dtype == other.dtype and torch.equal(value, other)
            ):
                return False
        elif value != other:
            return False
    return True


def _optimizer_state(model: Any, optimizer: Any) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    inner = getattr(optimizer, "optimizer", optimizer)
    return {
        k: v.clone() if isinstance(v, torch.Tensor) else v
        for k, v in _local(get_optimizer_state_dict(model, inner)).items()
    }


def _per_rank(root: str) -> dict[str, Any]:
    import torch.distributed as dist

    from accelerando.backends.strategies.fsdp.state import OPTIMIZER_SHARDS_NAME
    from accelerando.checkpointing.files import UnsafeCheckpointError

    accelerator, model, optimizer = _setup()
    torch.manual_seed(1 + accelerator.process_index)
    for _ in range(2):
        accelerator.backward(model(torch.randn(4, 8)).pow(2).sum())
        optimizer.step()
        optimizer.zero_grad()
    clean = accelerator.save_state(os.path.join(root, "clean"))
    hostile = accelerator.save_state(os.path.join(root, "hostile"))
    saved = _optimizer_state(model, optimizer)
    canary = os.path.join(root, "canary_load")
    if accelerator.is_main_process:
        plant(os.path.join(hostile, f"{OPTIMIZER_SHARDS_NAME}_0"), canary)
        _resign(hostile)
    dist.barrier()

    out: dict[str, Any] = {}
    accelerator, model, optimizer = _setup()
    try:
        accelerator.load_state(hostile)
        out["hostile"] = "loaded"
    except UnsafeCheckpointError as err:
        out["hostile"] = f"UnsafeCheckpointError: {err}"
    except BaseException as err:  # noqa: BLE001 - reported to the test, which fails on it
        out["hostile"] = f"{type(err).__name__}: {err}"
    dist.barrier()
    out["ran"] = os.path.exists(canary)

    accelerator, model, optimizer = _setup()
    accelerator.load_state(clean)
    out["clean_bitwise"] = _same(saved, _optimizer_state(model, optimizer))
    out["clean_keys"] = len(saved)
    return out


def _merge_checks(root: str) -> dict[str, Any]:
    from accelerando.backends.strategies.fsdp.checkpoint import merge_fsdp_weights
    from accelerando.backends.strategies.fsdp.state import OPTIMIZER_SHARDS_NAME
    from accelerando.checkpointing.files import UnsafeCheckpointError

    out: dict[str, Any] = {}
    shards = os.path.join(root, "hostile", f"{OPTIMIZER_SHARDS_NAME}_0")
    canary = os.path.join(root, "canary_merge")
    plant(shards, canary)  # re-planted, pointing at this canary
    try:
        merge_fsdp_weights(shards, os.path.join(root, "merged"))
        out["merge"] = "merged"
    except UnsafeCheckpointError as err:
        out["merge"] = str(err)
    out["merge_ran"] = os.path.exists(canary)
    # The opt-in unpickles fully: the payload runs (proof that the planted item is really read).
    merge_fsdp_weights(shards, os.path.join(root, "merged_trusted"), load_kwargs={"weights_only": False})
    out["trusted_ran"] = os.path.exists(canary)
    return out


@pytest.mark.timeout(600)
def test_planted_dcp_item_runs_nothing_and_clean_checkpoint_loads_bitwise(tmp_path) -> None:
    results = run_distributed_preloaded(_per_rank, 2, str(tmp_path), env=ENV, timeout=400)
    for rank, out in enumerate(results):
        assert out["hostile"].startswith("UnsafeCheckpointError"), (rank, out["hostile"][:2000])
        assert "__0_0.distcp" in out["hostile"] and "system" in out["hostile"], out["hostile"]
        assert "weights_only" in out["hostile"], out["hostile"]
        assert not out["ran"], f"rank {rank}: the planted payload ran"
        assert out["clean_bitwise"] and out["clean_keys"] > 4, out
    assert not (tmp_path / "canary_load").exists()

    merged = _merge_checks(str(tmp_path))
    assert "Refused to merge" in merged["merge"] and "system" in merged["merge"], merged
    assert "--trust_checkpoint" in merged["merge"], merged
    assert not merged["merge_ran"]
    assert merged["trusted_ran"], "the opt-in should unpickle fully (the planted item is read)"


def test_dcp_loads_driven_by_other_libraries_are_weights_only(tmp_path) -> None:
    """megatron-core drives DCP with torch's own DefaultLoadPlanner and FileSystemReader: within
    ``weights_only_dcp_reads`` (which its load runs in) a planted item and a planted ``.metadata`` run
    nothing; a clean folder loads bitwise; the opt-in unpickles fully."""
    import warnings

    import torch.distributed.checkpoint as dcp

    from accelerando.backends.strategies.fsdp.state import weights_only_dcp_reads
    from accelerando.checkpointing.files import UnsafeCheckpointError, unpickling

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    saved = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
    folder = str(tmp_path / "iter_0000001")

    def load() -> dict[str, Any]:
        state = {
            "model": {k: torch.zeros_like(v) for k, v in saved["model"].items()},
            "optimizer": {
                "state": {
                    i: {k: torch.zeros_like(v) for k, v in s.items()}
                    for i, s in saved["optimizer"]["state"].items()
                },
                "param_groups": [dict(g, lr=0.0) for g in saved["optimizer"]["param_groups"]],
            },
        }
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # no process group
            with weights_only_dcp_reads(folder):
                dcp.load(state, checkpoint_id=folder)  # torch's own planner and reader
        return state

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(saved, checkpoint_id=folder)
    clean = load()
    assert all(torch.equal(clean["model"][k], v) for k, v in saved["model"].items())
    assert clean["optimizer"]["param_groups"][0]["lr"] == 0.01
    canary = str(tmp_path / "canary")
    plant(folder, canary)
    with pytest.raises(BaseException) as info:  # DCP wraps it: CheckpointException (a BaseException)
        load()
    assert "UnsafeCheckpointError" in repr(info.value) or isinstance(info.value, UnsafeCheckpointError), (
        info.value
    )
    assert "system" in str(info.value)
    assert not os.path.exists(canary)
    with unpickling(False):  # the caller's opt-in: torch's full unpickling, the payload runs
        load()
    assert os.path.exists(canary)
    os.remove(canary)
    with open(os.path.join(folder, ".metadata"), "wb") as handle:
        pickle.dump(Payload(canary), handle)
    with pytest.raises(BaseException) as info:
        load()
    assert "system" in str(info.value) and not os.path.exists(canary), info.value
