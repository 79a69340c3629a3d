"""The rendezvous preflight: a wrong address or a taken port is a clear error, not a hang."""

from __future__ import annotations

import errno
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import accelerando.launchers.preflight as preflight
from accelerando.launchers.preflight import Rendezvous, RendezvousError, check_rendezvous, rendezvous_of
from accelerando.test_utils.distributed import get_free_port


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port some other program listens on."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


def test_the_rendezvous_is_read_from_the_agent_arguments() -> None:
    static = ["--nnodes", "2", "--nproc_per_node", "1", "--node_rank", "1", "--master_addr", "10.1.2.3",
              "--master_port", "29501", "--max_restarts", "0", "train.py"]  # fmt: skip
    assert rendezvous_of(static) == Rendezvous("10.1.2.3", 29501, machine_rank=1, num_machines=2)
    dynamic = [
        "--nnodes",
        "1:4",
        "--node_rank",
        "0",
        "--rdzv_backend",
        "c10d",
        "--rdzv_endpoint",
        "[::1]:29400",
    ]
    assert rendezvous_of(dynamic) == Rendezvous("::1", 29400, machine_rank=0, num_machines=4, backend="c10d")
    assert rendezvous_of(["--nnodes", "1", "train.py"]) is None


def test_a_taken_port_on_machine_0_names_the_port_and_the_fix(taken_port: int) -> None:
    with pytest.raises(
        RendezvousError, match=f"port {taken_port} \\(--main_process_port\\) is already in use"
    ):
        check_rendezvous(Rendezvous("127.0.0.1", taken_port, machine_rank=0, num_machines=2))
    # The other machines only connect to it: a taken port there is machine 0 listening.
    assert check_rendezvous(Rendezvous("127.0.0.1", taken_port, machine_rank=1, num_machines=2)) == []
    assert check_rendezvous(Rendezvous("127.0.0.1", get_free_port(), machine_rank=0, num_machines=2)) == []


def test_an_unresolvable_host_names_the_host_and_the_fix() -> None:
    for rank in (0, 1):
        with pytest.raises(
            RendezvousError, match="'no-such-host.invalid' \\(--main_process_ip\\) does not resolve"
        ):
            check_rendezvous(
                Rendezvous("no-such-host.invalid", 29500, machine_rank=rank, num_machines=2),
                resolve_timeout=1,
            )


def test_a_name_that_appears_a_moment_late_is_waited_for() -> None:
    answers = [socket.gaierror(socket.EAI_NONAME, "Name or service not known")] * 2 + [["127.0.0.1"]]

    def late(host: str, timeout: float) -> list[str]:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert (
        check_rendezvous(Rendezvous("job-master-0", 29500, machine_rank=1, num_machines=2), resolve=late)
        == []
    )
    assert answers == []


def test_a_name_server_that_does_not_answer_is_an_error_after_the_timeout() -> None:
    def silent(host: str, timeout: float) -> list[str]:
        raise TimeoutError(f"no answer within {timeout:g} s (is the name server reachable?)")

    with pytest.raises(RendezvousError, match="does not resolve: no answer within 5 s"):
        check_rendezvous(Rendezvous("slow.example", 29500, machine_rank=1, num_machines=2), resolve=silent)


def test_a_dynamic_backend_only_warns_about_a_name_not_resolvable_yet() -> None:
    rdzv = Rendezvous("job-worker-0.invalid", 29400, machine_rank=0, num_machines=2, backend="c10d")
    (warning,) = check_rendezvous(rdzv, resolve_timeout=1)
    assert "does not resolve" in warning and "c10d rendezvous retries" in warning


def test_machine_0_on_an_address_of_another_machine_is_a_warning() -> None:
    rdzv = Rendezvous("machine-zero", get_free_port(), machine_rank=0, num_machines=2)
    (warning,) = check_rendezvous(rdzv, resolve=lambda host, timeout: ["192.0.2.7"])
    assert "192.0.2.7" in warning and "--machine_rank" in warning


def test_an_unreachable_machine_0_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    unreachable = OSError(errno.EHOSTUNREACH, "No route to host")
    monkeypatch.setattr(preflight, "_connect_error", lambda address, port, timeout: unreachable)
    rdzv = Rendezvous("10.9.9.9", 29500, machine_rank=1, num_machines=2)
    with pytest.raises(
        RendezvousError, match="machine 0 at 10.9.9.9:29500 .* unreachable .*No route to host"
    ):
        check_rendezvous(rdzv, resolve=lambda host, timeout: ["10.9.9.9"])
    # Refused means machine 0 has not started yet: the launch waits for it as usual.
    monkeypatch.setattr(preflight, "_connect_error", lambda *a: OSError(errno.ECONNREFUSED, "refused"))
    assert check_rendezvous(rdzv, resolve=lambda host, timeout: ["10.9.9.9"]) == []


def _launch(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess:
    script = tmp_path / "never.py"
    script.write_text("raise SystemExit('the preflight should have stopped the launch')\n")
    env = {**os.environ, "ACCELERANDO_CONFIG_FILE": os.devnull}
    base = ["--cpu", "--num_machines", "2", "--num_processes", "2"]
    # The timeout only keeps a regression from hanging the suite; the checks take seconds.
    return subprocess.run(
        [sys.executable, "-m", "accelerando.commands.launch", *base, *argv, str(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_launcher_stops_before_starting_anything_when_the_port_is_taken(
    tmp_path: Path, taken_port: int
) -> None:
    done = _launch(tmp_path, "--machine_rank", "0", "--main_process_ip", "127.0.0.1",
                   "--main_process_port", str(taken_port))  # fmt: skip
    assert done.returncode == 2
    assert f"port {taken_port} (--main_process_port) is already in use" in done.stderr
    assert "Fix: pass a free port" in done.stderr and "preflight should have stopped" not in done.stderr


def test_the_launcher_stops_at_once_on_an_unresolvable_host(tmp_path: Path) -> None:
    done = _launch(tmp_path, "--machine_rank", "1", "--main_process_ip", "no-such-host.invalid",
                   "--main_process_port", "29517")  # fmt: skip
    assert done.returncode == 2
    assert "'no-such-host.invalid' (--main_process_ip) does not resolve" in done.stderr
    assert "getent hosts no-such-host.invalid" in done.stderr
