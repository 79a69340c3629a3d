"""Fault tolerance (torchft) opens nothing beyond this machine unless told, and runs nothing a peer sends.

Issue 41: torchft's lighthouse, managers, stores and checkpoint servers listen on loopback by default
(item 1; the launch test lists every listening socket of a running fault-tolerant job); a heal's reply
is loaded weights-only, so a ``__reduce__`` payload planted in it by a fake replica does not run and
the heal is refused with one line (item 2); exposing the servers to other machines needs
``--ft_insecure`` (item 3: torchft's servers cannot authenticate).
"""

from __future__ import annotations

import io
import os
import sys
import threading
import time
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch

pytest.importorskip("torchft")

from torchft_support import launch, read_log, steps_of, wait_until  # noqa: E402

from accelerando.backends.strategies.fault_tolerance.manager import start_manager  # noqa: E402
from accelerando.backends.strategies.fault_tolerance.transport import (  # noqa: E402
    HealRefusedError,
    WeightsOnlyTransport,
)
from accelerando.commands.launch.parser import build_parser, parse  # noqa: E402
from accelerando.commands.launch.resolution import plan_for  # noqa: E402
from accelerando.launchers import ft  # noqa: E402
from accelerando.plugins.fault_tolerance import FaultTolerancePlugin  # noqa: E402
from listener_probe import job_pids, listeners, non_loopback  # noqa: E402


class Planted:
    """Unpickling this writes a marker file: proof that code sent over the network ran."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        return (Path(self.marker).write_text, ("the payload ran",))


class _FakeReplica:
    """An HTTP server answering every GET with ``body``: a replica that joined the quorum to be healed from."""

    def __init__(self, body: bytes) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.metadata = f"http://127.0.0.1:{self.server.server_address[1]}/checkpoint/"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _payload(marker: Path, streaming: bool = False) -> bytes:
    state = {
        "user": {"model_0": {"weight": torch.ones(2)}, "planted": Planted(str(marker))},
        "torchft": {"step": 9},
    }
    buffer = io.BytesIO()
    if streaming:  # the format torchft's own HTTPTransport reads
        from torch.distributed._serialization import _streaming_save

        _streaming_save(state, buffer)
    else:
        torch.save(state, buffer)
    return buffer.getvalue()


def test_a_planted_payload_in_a_heal_reply_does_not_run_and_the_heal_is_refused(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    fake = _FakeReplica(_payload(marker))
    transport = WeightsOnlyTransport("127.0.0.1", timedelta(seconds=10))
    try:
        with pytest.raises(HealRefusedError) as refused:
            transport.recv_checkpoint(3, fake.metadata, 9, timedelta(seconds=10))
    finally:
        fake.close()
        transport.shutdown()
    message = str(refused.value)
    print(f"payloads that ran: {int(marker.exists())} of 1; the refusal: {message}")
    assert not marker.exists()
    assert "\n" not in message and "refused the heal from replica 3" in message and "weights-only" in message


def test_torchfts_own_transport_would_have_run_it(tmp_path: Path) -> None:
    """The reason for WeightsOnlyTransport: torchft's HTTPTransport loads the reply with weights_only=False."""
    from torchft.checkpointing.http_transport import HTTPTransport

    marker = tmp_path / "ran"
    fake = _FakeReplica(_payload(marker, streaming=True))
    try:
        HTTPTransport._load_from_address(f"{fake.metadata}9/full", timedelta(seconds=10))
    finally:
        fake.close()
    assert marker.exists()


def test_a_heal_between_groups_round_trips_weights_and_listens_on_loopback() -> None:
    sender = WeightsOnlyTransport("127.0.0.1", timedelta(seconds=10))
    receiver = WeightsOnlyTransport("127.0.0.1", timedelta(seconds=10))
    state = {
        "user": {"model_0": {"weight": torch.randn(3, 2)}, "optimizer_0": {"state": {}, "param_groups": [
            {"lr": 0.1, "betas": (0.9, 0.99), "foreach": None, "params": [0]}]}},
        "torchft": {"step": 4, "batches_committed": 8},
    }  # fmt: skip
    try:
        found = [s for s in listeners({os.getpid()}) if s.port in (sender._server.server_address[1],)]
        assert found and not non_loopback(found), [str(s) for s in found]
        sender.send_checkpoint([1], 4, state, timedelta(seconds=10))
        got = receiver.recv_checkpoint(0, sender.metadata(), 4, timedelta(seconds=10))
        sender.disallow_checkpoint()
        with pytest.raises(HealRefusedError):  # a step no longer offered is answered 409, not stale weights
            receiver.recv_checkpoint(0, sender.metadata(), 4, timedelta(seconds=1))
    finally:
        sender.shutdown()
        receiver.shutdown()
    assert torch.equal(got["user"]["model_0"]["weight"], state["user"]["model_0"]["weight"])
    assert got["user"]["optimizer_0"] == state["user"]["optimizer_0"] and got["torchft"] == state["torchft"]


# --- exposing torchft's servers needs --ft_insecure ----------------------------------------------------


def _plan(tmp_path: Path, *flags: str) -> ft.FaultTolerantPlan:
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    args = parse(build_parser(), ["--fault_tolerance", *flags, str(script)])
    settings, first = plan_for(args)
    return ft.build(settings, first, lambda: plan_for(args)[1])


@pytest.mark.usefixtures("isolated_env")
def test_torchft_servers_leave_loopback_only_with_ft_insecure(tmp_path: Path) -> None:
    assert _plan(tmp_path).bind_address == "127.0.0.1"
    with pytest.raises(ValueError, match="no authentication.*--ft_insecure") as refused:
        _plan(tmp_path, "--bind_address", "10.0.0.5")
    assert "\n" not in str(refused.value)
    with pytest.raises(ValueError, match="--bind_address <this machine's address> --ft_insecure"):
        _plan(tmp_path, "--ft_lighthouse", "http://10.0.0.1:29510")
    assert _plan(tmp_path, "--bind_address", "10.0.0.5", "--ft_insecure").bind_address == "10.0.0.5"
    assert _plan(tmp_path, "--ft_lighthouse", "http://127.0.0.1:29510").bind_address == "127.0.0.1"


def test_a_process_refuses_to_expose_its_servers_without_ft_insecure() -> None:
    plugin = FaultTolerancePlugin(lighthouse="http://10.0.0.1:29510", replica_id=0)
    with pytest.raises(ValueError, match="--ft_insecure"):
        start_manager(plugin, 0, 1, bind_address="0.0.0.0")


# --- a running fault-tolerant job ----------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_fault_tolerant_launch_listens_on_loopback_only(tmp_path: Path) -> None:
    launcher = launch(tmp_path, step_sleep=0.05, max_restarts=0)
    try:
        both = lambda: all(len(steps_of(read_log(tmp_path, i))) >= 3 for i in (0, 1))  # noqa: E731
        wait_until(both, launcher, 300, "both groups committed 3 steps")
        found = listeners(job_pids(launcher.pid))
        newest = max(r["step"] for i in (0, 1) for r in steps_of(read_log(tmp_path, i)))
        (tmp_path / "stop_at").write_text(str(newest + 2))
        launcher.wait(timeout=120)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    exposed = non_loopback(found)
    print(
        f"listeners: {len(found)}, on non-loopback addresses: {len(exposed)}: " + "; ".join(map(str, found))
    )
    assert exposed == [], "\n".join(map(str, exposed))
    # The lighthouse (launcher), two managers, two stores, two checkpoint servers at least.
    assert len(found) >= 7, [str(s) for s in found]
    assert launcher.returncode == 0, (tmp_path / "launch.log").read_text()[-3000:]
    time.sleep(0)  # nothing left running
