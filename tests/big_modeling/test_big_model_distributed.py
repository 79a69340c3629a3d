"""Loading checkpoints in 2 real processes: ``broadcast_from_rank0`` (only rank 0 reads the checkpoint;
every rank ends with the same weights) and loading into FSDP2's DTensor parameters (a full checkpoint and
per-process shards). One launch runs both checks (each launch costs its processes' torch import)."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from accelerando.big_modeling import init_empty_weights
from accelerando.utils.modeling import load_checkpoint_in_model
from suite_support import run_distributed_preloaded

test_utils = pytest.importorskip("accelerando.test_utils.distributed")


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))


def _load_on_rank(folder: str) -> list[list[float]]:
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo")
    # Only rank 0 is given the real path: the others must receive everything by broadcast.
    checkpoint = folder if dist.get_rank() == 0 else f"{folder}/does-not-exist"
    with init_empty_weights():
        model = _model()
    missing, unexpected = load_checkpoint_in_model(model, checkpoint, broadcast_from_rank0=True)
    assert missing == [] and unexpected == []
    return [p.detach().flatten().tolist() for p in model.parameters()]


def test_broadcast_from_rank0(launched):
    results, expected = [rank["broadcast"] for rank in launched["ranks"]], launched["broadcast_expected"]
    assert results[0] == expected and results[1] == expected


def _load_into_fully_sharded(full_path: str, shard_dir: str) -> dict:
    import os

    import torch
    from safetensors.torch import save_file
    from torch.distributed.fsdp import fully_shard

    from accelerando.state import PartialState
    from accelerando.utils.modeling import load_checkpoint_in_model

    state = PartialState()
    reference = torch.load(full_path.replace(".safetensors", ".pt"))

    def fresh():
        torch.manual_seed(100 + state.process_index)  # different weights than the checkpoint
        model = torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.Linear(6, 4))
        for layer in model:
            fully_shard(layer)
        return fully_shard(model)

    model = fresh()
    missing, unexpected = load_checkpoint_in_model(model, full_path)
    full_ok = all(torch.equal(p.full_tensor(), reference[n]) for n, p in model.state_dict().items())
    # Each process writes exactly its own shards, then loads them with full_state_dict=False.
    mine = os.path.join(shard_dir, f"rank{state.process_index}.safetensors")
    save_file({n: p.to_local().contiguous() for n, p in model.state_dict().items()}, mine)
    again = fresh()
    load_checkpoint_in_model(again, mine, full_state_dict=False)
    shard_ok = all(torch.equal(p.full_tensor(), reference[n]) for n, p in again.state_dict().items())
    return {"full": full_ok, "shards": shard_ok, "missing": missing, "unexpected": unexpected}


def _both_checks(broadcast_folder: str, full_path: str, shard_dir: str) -> dict:
    return {
        "broadcast": _load_on_rank(broadcast_folder),
        "dtensor": _load_into_fully_sharded(full_path, shard_dir),
    }


@pytest.fixture(scope="module")
def launched(tmp_path_factory) -> dict:
    """One 2-process launch running both checks; per-rank results and the broadcast's expected weights."""
    broadcast_folder = tmp_path_factory.mktemp("broadcast")
    torch.manual_seed(0)
    reference = _model()
    save_file(reference.state_dict(), broadcast_folder / "model.safetensors")
    expected = [p.detach().flatten().tolist() for p in reference.parameters()]

    sharded_folder = tmp_path_factory.mktemp("dtensor")
    torch.manual_seed(0)
    full = torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.Linear(6, 4)).state_dict()
    full_path = str(sharded_folder / "full.safetensors")
    save_file(full, full_path)
    torch.save(full, str(sharded_folder / "full.pt"))
    ranks = run_distributed_preloaded(_both_checks, 2, str(broadcast_folder), full_path, str(sharded_folder))
    return {"ranks": ranks, "broadcast_expected": expected}


def test_load_into_dtensor_parameters_full_and_per_process_shards(launched):
    results = [rank["dtensor"] for rank in launched["ranks"]]
    assert results == [{"full": True, "shards": True, "missing": [], "unexpected": []}] * 2
