"""Check that a sharded FSDP checkpoint merged with ``merge_fsdp_weights`` equals the unsharded state.

With two or more processes a small model is trained one step under FSDP
(``state_dict_type="SHARDED_STATE_DICT"``), saved with ``save_state`` (one shard per process under
``pytorch_model_fsdp_0``), and the main process merges the shards into ``model.safetensors`` with
``merge_fsdp_weights``: every tensor must equal the full state dict ``get_state_dict`` gathers, and a
plain model loading the merged file computes the same outputs. In one process FSDP does not run (it
needs two), so the shards are written by ``torch.distributed.checkpoint`` without a process group
and merged the same way.

Run with ``accelerando launch`` / ``torchrun`` (CPU with gloo or GPUs). A failed check raises
``AssertionError`` (exit status 1).
"""

from __future__ import annotations

import os
import shutil
import tempfile

import torch

from accelerando import Accelerator, FullyShardedDataParallelPlugin, PartialState
from accelerando.backends.strategies.fsdp.helpers import merge_fsdp_weights
from accelerando.common.operations import broadcast_object_list

__all__ = ["check_merge_one_process", "check_merge_sharded", "main"]


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(16, 32),
        torch.nn.ReLU(),
        torch.nn.Linear(32, 32),
        torch.nn.ReLU(),
        torch.nn.Linear(32, 4),
    )


def _check_merged(output: str, full: dict[str, torch.Tensor]) -> None:
    """The merged ``model.safetensors`` holds ``full`` exactly and a plain model loads it."""
    from safetensors.torch import load_file

    merged = load_file(os.path.join(output, "model.safetensors"))
    assert set(merged) == set(full), f"merged keys {sorted(merged)} != {sorted(full)}"
    for name, tensor in full.items():
        assert torch.equal(merged[name].cpu(), tensor.cpu()), f"{name} differs after merging"
    plain = _model()
    plain.load_state_dict(merged)
    x = torch.randn(3, 16)
    reference = _model()
    reference.load_state_dict({k: v.cpu() for k, v in full.items()})
    assert torch.equal(plain(x), reference(x)), "the merged weights compute other outputs"


def check_merge_one_process(folder: str) -> None:
    """Shards written without a process group merge into the same weights."""
    import torch.distributed.checkpoint as dcp

    full = _model().state_dict()
    shards = os.path.join(folder, "pytorch_model_fsdp_0")
    # dcp.save is public (documented) but re-exported in a way pyright does not see
    dcp.save({"model": full}, storage_writer=dcp.FileSystemWriter(shards), no_dist=True)  # pyright: ignore[reportPrivateImportUsage]
    _check_merged(merge_fsdp_weights(shards, os.path.join(folder, "merged")), full)


def check_merge_sharded(folder: str) -> None:
    """FSDP's sharded ``save_state`` merged by the main process equals the gathered full state."""
    plugin = FullyShardedDataParallelPlugin(
        state_dict_type="SHARDED_STATE_DICT", auto_wrap_policy="SIZE_BASED_WRAP", min_num_params=100
    )
    accelerator = Accelerator(fsdp_plugin=plugin)
    model = accelerator.prepare(_model())
    optimizer = accelerator.prepare(torch.optim.SGD(model.parameters(), lr=0.1))
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(accelerator.process_index))
    accelerator.backward(model(x.to(accelerator.device)).pow(2).mean())
    optimizer.step()
    accelerator.save_state(folder)
    full = accelerator.get_state_dict(model)  # every process joins the gather; the main one gets it
    shards = os.path.join(folder, "pytorch_model_fsdp_0")
    assert os.path.isdir(shards), f"save_state wrote no sharded model folder: {os.listdir(folder)}"
    if accelerator.is_main_process:
        _check_merged(merge_fsdp_weights(shards, os.path.join(folder, "merged")), full)
    accelerator.wait_for_everyone()


def main() -> None:
    """Run the check for this launch's process count; the main process prints the outcome."""
    state = PartialState()
    folder = [tempfile.mkdtemp(prefix="merge_weights_") if state.is_main_process else None]
    folder = broadcast_object_list(folder) if state.num_processes > 1 else folder
    try:
        if state.num_processes == 1:
            state.print("FSDP needs two processes: merging shards written by torch.distributed.checkpoint")
            check_merge_one_process(str(folder[0]))
        else:
            check_merge_sharded(str(folder[0]))
        state.print("merge_fsdp_weights: the merged weights equal the unsharded state.")
    finally:
        state.wait_for_everyone()
        if state.is_main_process:
            shutil.rmtree(str(folder[0]), ignore_errors=True)


if __name__ == "__main__":
    main()
