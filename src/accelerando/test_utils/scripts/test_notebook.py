"""Check ``notebook_launcher``: a function runs on N processes, restarts recover, failures surface.

Run it with plain ``python`` (it starts the processes itself); ``ACCELERATE_NUM_PROCESSES`` (default
1) says how many, as in the reference's suite. The checks:

* basic: the function sees ``N`` processes, each its own rank, and the results come back by rank;
* static and ``c10d`` rendezvous backends both form the job;
* fault tolerance: a function that fails on its first attempt succeeds with ``max_restarts``;
* monitoring: a function that fails on even ranks makes ``notebook_launcher`` raise with that
  failure's message (in one process, the error itself propagates).

Restarts apply to launched processes only: with one process (run in this one) that check is
skipped with its reason printed. A failed check raises ``AssertionError`` (exit status 1).
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile

from accelerando import PartialState
from accelerando.core.settings.resolve import environment_value
from accelerando.launchers.notebook import notebook_launcher

__all__ = [
    "check_basic",
    "check_fault_tolerance",
    "check_monitoring",
    "check_rendezvous",
    "main",
]

_NUT = "The nut has not cracked yet"
_EVEN = "An even process refuses to sleep"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _rank_and_world() -> tuple[int, int]:
    state = PartialState()
    return state.process_index, state.num_processes


def _results(result: object, num_processes: int) -> list[object]:
    """``notebook_launcher`` returns the value itself in one process, a list by rank otherwise."""
    return [result] if num_processes == 1 else list(result)  # type: ignore[call-overload]


def check_basic(num_processes: int) -> None:
    """Every process sees the job's size and its own rank; results come back by rank."""
    results = _results(notebook_launcher(_rank_and_world, num_processes=num_processes), num_processes)
    expected = [(rank, num_processes) for rank in range(num_processes)]
    assert results == expected, f"basic launch returned {results}, expected {expected}"


def check_rendezvous(num_processes: int, backend: str) -> None:
    """The ``backend`` rendezvous forms the same job."""
    port = _free_port()
    result = notebook_launcher(
        _rank_and_world,
        num_processes=num_processes,
        use_port=port,
        rdzv_backend=backend,
        rdzv_endpoint=f"127.0.0.1:{port}",
    )
    expected = [(rank, num_processes) for rank in range(num_processes)]
    assert _results(result, num_processes) == expected, f"{backend} rendezvous returned {result}"


def _tough_nut(marker_dir: str) -> str:
    """Fail on each process's first attempt (leaving a marker), succeed on the next."""
    marker = os.path.join(marker_dir, f"attempt_{PartialState().process_index}")
    if not os.path.exists(marker):
        open(marker, "w").close()
        raise RuntimeError(_NUT)
    return "cracked"


def check_fault_tolerance(num_processes: int) -> None:
    """With ``max_restarts`` the job restarts after the first failures and then succeeds."""
    marker_dir = tempfile.mkdtemp(prefix="notebook_restart_")
    try:
        result = notebook_launcher(_tough_nut, (marker_dir,), num_processes=num_processes, max_restarts=3)
    finally:
        shutil.rmtree(marker_dir, ignore_errors=True)
    assert _results(result, num_processes) == ["cracked"] * num_processes, f"restarted job returned {result}"


def _bipolar() -> None:
    if PartialState().process_index % 2 == 0:
        raise RuntimeError(_EVEN)


def check_monitoring(num_processes: int) -> None:
    """A failing process makes ``notebook_launcher`` raise, its message carried to the caller."""
    try:
        notebook_launcher(_bipolar, num_processes=num_processes, monitor_interval=0.1)
    except RuntimeError as error:  # LaunchedFunctionError is a RuntimeError
        assert _EVEN in str(error), f"the failure's message was lost: {error}"
    else:
        raise AssertionError("notebook_launcher returned although a process failed")


def main() -> None:
    """Run every check with ``ACCELERATE_NUM_PROCESSES`` processes (default 1)."""
    num_processes = int(environment_value("num_processes") or 1)  # ACCELERATE_NUM_PROCESSES
    print(f"Test basic notebook launch on {num_processes} process(es)")
    check_basic(num_processes)
    for backend in ("static", "c10d"):
        print(f"Test {backend} rendezvous backend")
        check_rendezvous(num_processes, backend)
    print("Test fault tolerance")
    if num_processes == 1:
        print("  skipped: restarts apply to launched processes; one process runs in this one")
    else:
        check_fault_tolerance(num_processes)
    print("Test monitoring")
    check_monitoring(num_processes)
    print("All notebook_launcher checks passed.")


if __name__ == "__main__":
    main()
