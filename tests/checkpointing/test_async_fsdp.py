"""FSDP (sharded state dict) with ``save_state(async_save=True)``: DCP shards written in the background.

Three launches of 2 processes (gloo): (1) an asynchronous save whose shard writing is held back while
training goes on, then committed; (2) a save that crashes (``os._exit``) in the background before the
commit; (3) fresh processes load the newest checkpoint and continue: bitwise what the uninterrupted
run computed, so the crash left the first checkpoint the newest.
"""

from __future__ import annotations

import hashlib
import os
import threading

import pytest
import torch

from accelerando.test_utils import run_distributed
from suite_support import reset_accelerator_state

pytestmark = pytest.mark.slow  # three 2-process launches

VERSIONS = (2, 1)  # FSDP2, FSDP1


def _setup(root: str, version: int):
    from accelerando import Accelerator, FullyShardedDataParallelPlugin
    from accelerando.utils import ProjectConfiguration

    reset_accelerator_state(partial=False)
    plugin = FullyShardedDataParallelPlugin(
        fsdp_version=version,
        state_dict_type="SHARDED_STATE_DICT",
        auto_wrap_policy="SIZE_BASED_WRAP",
        min_num_params=50,
    )
    project = ProjectConfiguration(
        project_dir=os.path.join(root, f"fsdp{version}"), automatic_checkpoint_naming=True
    )
    acc = Accelerator(fsdp_plugin=plugin, project_config=project)
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 16),
        torch.nn.ReLU(),
        torch.nn.Linear(16, 16),
        torch.nn.ReLU(),
        torch.nn.Linear(16, 4),
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, opt = acc.prepare(model, opt)
    return acc, model, opt


def _train(acc, model, opt, first: int, count: int) -> list[float]:
    losses = []
    for step in range(first, first + count):
        g = torch.Generator().manual_seed(100 * step + acc.process_index)
        x, y = torch.randn(4, 8, generator=g), torch.randn(4, 4, generator=g)
        loss = torch.nn.functional.mse_loss(model(x), y)
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def _digest(acc, model) -> str:
    state = acc.get_state_dict(model)
    h = hashlib.sha256()
    for key in sorted(state):
        h.update(key.encode() + state[key].numpy().tobytes())
    return h.hexdigest() if acc.is_main_process else ""


def _metadata_files(root: str) -> list[str]:
    return [os.path.join(d, n) for d, _, names in os.walk(root) for n in names if n == ".metadata"]


def _save_worker(root: str) -> dict:
    """Train 2 steps, save asynchronously with the shard writing held back, train 2 more, commit."""
    import accelerando.checkpointing.async_dcp as async_dcp
    from accelerando.checkpointing.atomic import read_manifest

    release = threading.Event()
    original = async_dcp.ShardWrites.write_all

    def held(self, group):
        release.wait(120)
        return original(self, group)

    async_dcp.ShardWrites.write_all = held
    out = {}
    for version in VERSIONS:
        release.clear()
        acc, model, opt = _setup(root, version)
        _train(acc, model, opt, 0, 2)
        handle = acc.save_state(async_save=True)
        written_before = _metadata_files(acc.project_dir)
        tail = _train(acc, model, opt, 2, 2)  # while the shards wait to be written
        release.set()
        folder = handle.result()
        names = set(read_manifest(folder).files)
        out[version] = {
            "written_before": written_before,
            "tail": tail,
            "digest": _digest(acc, model),
            "folder": os.path.basename(folder),
            "shards": sorted({n.split("/")[0] for n in names if "/" in n}),
            "metadata": sorted(n for n in names if n.endswith(".metadata")),
        }
    return out


def _crash_worker(root: str) -> None:
    """Resume, train a step, save asynchronously and die in the background before the commit."""
    import accelerando.checkpointing.save as sync

    def die(*args, **kwargs):
        os._exit(17)

    sync._commit_everywhere = die
    acc, model, opt = _setup(root, 2)
    acc.load_state()
    _train(acc, model, opt, 2, 1)
    acc.save_state(async_save=True).result()
    raise AssertionError("the background save should have ended the process")


def _crash_rank(rank: int, port: int, root: str) -> None:
    os.environ.update(
        {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": "2",
            "LOCAL_WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": "1",
        }
    )
    _crash_worker(root)


def _crashed_ranks(root: str) -> list[int | None]:
    """Run :func:`_crash_worker` in 2 processes; return their exit codes."""
    import multiprocessing as mp

    from accelerando.test_utils import get_free_port

    ctx = mp.get_context("spawn")
    port = get_free_port()
    procs = [ctx.Process(target=_crash_rank, args=(rank, port, root)) for rank in range(2)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=900)
        if proc.is_alive():
            proc.kill()
            proc.join()
    return [proc.exitcode for proc in procs]


def _load_worker(root: str) -> dict:
    """Fresh processes: load the newest checkpoint and train the 2 steps the saving run trained after it."""
    from accelerando.checkpointing import latest_checkpoint

    out = {}
    for version in VERSIONS:
        acc, model, opt = _setup(root, version)
        newest = latest_checkpoint(acc.project_dir)
        acc.load_state()
        tail = _train(acc, model, opt, 2, 2)
        out[version] = {"newest": os.path.basename(newest), "tail": tail, "digest": _digest(acc, model)}
    return out


@pytest.mark.timeout(1800)
def test_fsdp_async_save_writes_shards_in_background_survives_a_crash_and_resumes_bitwise(tmp_path):
    root = str(tmp_path)
    saved = run_distributed(_save_worker, 2, root, timeout=900)
    for rank in range(2):
        for version in VERSIONS:
            got = saved[rank][version]
            assert got["written_before"] == [], (rank, version, got)  # no shard written in the foreground
            assert got["folder"] == "checkpoint_0"
            assert got["shards"] == ["optimizer_0", "pytorch_model_fsdp_0"], got
            assert got["metadata"] == ["optimizer_0/.metadata", "pytorch_model_fsdp_0/.metadata"]
    assert _crashed_ranks(root) == [17, 17]  # both died in the background, before the commit
    leftovers = os.listdir(os.path.join(root, "fsdp2", "checkpoints"))
    assert "checkpoint_1" not in leftovers  # never committed
    loaded = run_distributed(_load_worker, 2, root, timeout=900)
    for rank in range(2):
        for version in VERSIONS:
            assert loaded[rank][version]["newest"] == "checkpoint_0"
            assert loaded[rank][version]["tail"] == saved[rank][version]["tail"]  # bitwise
            assert loaded[rank][version]["digest"] == saved[rank][version]["digest"]
