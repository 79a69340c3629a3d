"""Checks of the collective operations, to run under ``accelerando launch`` on any number of processes.

Every process builds data from its rank, calls the operation, and compares the result with the value
computed by hand; a failed check raises ``AssertionError`` (the launch then fails with its message).
"""

from __future__ import annotations

import torch

from accelerando.common.operations import (
    broadcast,
    broadcast_object_list,
    gather,
    gather_object,
    pad_across_processes,
    reduce,
)
from accelerando.state import PartialState

__all__ = [
    "check_broadcast",
    "check_gather",
    "check_gather_object",
    "check_pad_across_processes",
    "check_reduce",
    "main",
]


def _ranked(state: PartialState, rows: int = 3) -> torch.Tensor:
    # rank r holds r*rows+1 ... r*rows+rows, so the gathered tensor is 1 ... world*rows
    start = state.process_index * rows + 1
    return torch.arange(start, start + rows, dtype=torch.float32, device=state.device)


def check_gather(state: PartialState) -> None:
    """``gather`` concatenates every rank's tensor along dim 0, nested structures included."""
    rows = 3
    expected = torch.arange(1, state.num_processes * rows + 1, dtype=torch.float32)
    assert torch.equal(gather(_ranked(state, rows)).cpu(), expected), "gather of a tensor"
    nested = gather(
        {"values": _ranked(state, rows), "ranks": torch.tensor([state.process_index], device=state.device)}
    )
    assert torch.equal(nested["values"].cpu(), expected), "gather of a dict (values)"
    assert nested["ranks"].tolist() == list(range(state.num_processes)), "gather of a dict (ranks)"


def check_gather_object(state: PartialState) -> None:
    """``gather_object`` concatenates every rank's list of picklable objects in rank order."""
    got = gather_object([f"rank{state.process_index}", state.process_index])
    want = [item for rank in range(state.num_processes) for item in (f"rank{rank}", rank)]
    assert got == want, f"gather_object gave {got}, expected {want}"


def check_broadcast(state: PartialState) -> None:
    """``broadcast`` and ``broadcast_object_list`` copy process 0's values to every process."""
    got = broadcast(_ranked(state))
    assert torch.equal(got.cpu(), torch.tensor([1.0, 2.0, 3.0])), f"broadcast gave {got}"
    objects = broadcast_object_list([{"from": state.process_index}, "x" * state.process_index])
    assert objects == [{"from": 0}, ""], f"broadcast_object_list gave {objects}"


def check_pad_across_processes(state: PartialState) -> None:
    """``pad_across_processes`` pads each rank's tensor to the longest one, at the end or the start."""
    length = state.process_index + 2
    local = torch.ones(length, device=state.device)
    longest = state.num_processes + 1
    padded = pad_across_processes(local, pad_index=0)
    assert padded.shape[0] == longest, f"padded length {padded.shape[0]}, expected {longest}"
    assert padded[:length].eq(1).all() and padded[length:].eq(0).all(), "padding at the end"
    first = pad_across_processes(local, pad_index=-1, pad_first=True)
    assert first[longest - length :].eq(1).all() and first[: longest - length].eq(-1).all(), "padding first"


def check_reduce(state: PartialState) -> None:
    """``reduce`` sums (``"sum"`` or ``None``) or averages (``"mean"``) a tensor over processes."""
    local = torch.tensor([float(state.process_index + 1), 2.0], device=state.device)
    n = state.num_processes
    total = torch.tensor([n * (n + 1) / 2, 2.0 * n])
    assert torch.allclose(reduce(local.clone(), "sum").cpu(), total), "reduce sum"
    assert torch.allclose(reduce(local.clone(), "mean").cpu(), total / n), "reduce mean"
    assert torch.allclose(reduce(local.clone(), None).cpu(), total), "reduce None sums"
    # ``scale`` acts on XLA devices only, as in the reference; elsewhere the sum is left as it is.
    factor = 2.0 if state.device.type == "xla" else 1.0
    assert torch.allclose(reduce(local.clone(), "sum", scale=2.0).cpu(), factor * total), "reduce with scale"


def main() -> None:
    """Run every check; the main process prints a line per check.

    Raises:
        AssertionError: a check failed (the message says which).
    """
    state = PartialState()
    for check in (
        check_gather,
        check_gather_object,
        check_broadcast,
        check_pad_across_processes,
        check_reduce,
    ):
        check(state)
        state.print(f"PASS {check.__name__} on {state.num_processes} process(es)")
    state.wait_for_everyone()


if __name__ == "__main__":
    main()
