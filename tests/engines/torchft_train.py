"""The training script the torchft tests and benchmark launch (one per replica group).

Usage: ``accelerando launch --fault_tolerance ... torchft_train.py OUT_DIR MAX_STEPS STEP_SLEEP_S``.
Training stops at MAX_STEPS, or earlier at the step written in ``OUT_DIR/stop_at`` (a test writes it once
it has seen what it waits for; every group stops at that same step).

Each group appends JSON lines to ``OUT_DIR/group<replica>.jsonl``: one ``start`` line per start of the
process (with its pid), then one ``step`` line per step (the committed step count after it, whether it
was committed, the time, and a SHA-256 of the weights). Every start seeds the model differently, so a
restarted group holds the live groups' weights only if it recovered them from a peer. The batch of a step
depends only on the step number and the group, so a recovered group trains on what it would have.
At the end the group writes its weights to ``OUT_DIR/final<replica>.pt``. The script reads no checkpoint. Under HSDP each process of a group logs and hashes its own shards.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time

import torch
from torch.distributed.tensor import DTensor

from accelerando import Accelerator
from accelerando.backends.strategies.fault_tolerance import current_step


def _local_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """This process's weights: the whole model, or its shards under HSDP."""
    return {k: v.to_local() if isinstance(v, DTensor) else v for k, v in model.state_dict().items()}


def _weights_hash(model: torch.nn.Module) -> str:
    digest = hashlib.sha256()
    for name, tensor in sorted(_local_state(model).items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def _stop_step(out_dir: str, max_steps: int) -> int:
    try:
        with open(os.path.join(out_dir, "stop_at")) as stop:
            return min(max_steps, int(stop.read().strip() or max_steps))
    except (FileNotFoundError, ValueError):
        return max_steps


def main() -> None:
    out_dir, total_steps, step_sleep = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    accelerator = Accelerator()
    replica = accelerator._strategy.plugin.replica_id
    # Rank 0 of a group writes group<r>.jsonl / final<r>.pt; rank k > 0 (HSDP) adds ".rank<k>".
    tag = f"{replica}" if accelerator.process_index == 0 else f"{replica}.rank{accelerator.process_index}"
    log_path = os.path.join(out_dir, f"group{tag}.jsonl")
    starts = 0
    if os.path.exists(log_path):
        with open(log_path) as log:
            starts = sum('"start"' in line for line in log)
    torch.manual_seed(1000 + 10 * replica + starts)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    model, optimizer = accelerator.prepare(model, optimizer)
    plain = accelerator.unwrap_model(model)
    with open(log_path, "a", buffering=1) as log:
        log.write(
            json.dumps({"event": "start", "pid": os.getpid(), "t": time.time(), "attempt": starts}) + "\n"
        )
        while True:
            optimizer.zero_grad()  # the step's quorum: a restarted group recovers here
            step = current_step(accelerator)
            if step >= _stop_step(out_dir, total_steps):
                break
            batch = torch.Generator().manual_seed(7919 * step + replica)
            inputs = torch.randn(16, 8, generator=batch)
            loss = torch.nn.functional.mse_loss(model(inputs), inputs.sum(dim=1, keepdim=True))
            accelerator.backward(loss)
            optimizer.step()
            committed = current_step(accelerator)
            record = {"event": "step", "step": committed, "committed": committed > step, "t": time.time()}
            log.write(json.dumps({**record, "hash": _weights_hash(plain)}) + "\n")
            time.sleep(step_sleep)
    torch.save(_local_state(plain), os.path.join(out_dir, f"final{tag}.pt"))


if __name__ == "__main__":
    main()
