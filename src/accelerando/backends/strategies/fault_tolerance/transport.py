"""The weights a recovering replica group copies from a live one: served on one address, loaded weights-only.

torchft's default ``HTTPTransport`` serves the state on every interface and loads what it receives
with ``weights_only=False``: whoever can answer a heal (a fake replica that joined the quorum claiming
a higher step) runs code in every recovering process. :class:`WeightsOnlyTransport` is the same
protocol (torchft's ``CheckpointTransport``: ``send_checkpoint`` on the live group, ``recv_checkpoint``
on the recovering one, the address exchanged through the managers as ``metadata``), with two
differences:

- its server listens on the job's bind address only (loopback on one machine,
  :mod:`accelerando.core.listeners`);
- the reply is loaded with ``torch.load(weights_only=True)``: tensors, numbers, strings and
  containers of them; anything else in it (a ``__reduce__`` payload, a class) is refused before it
  runs, and the heal fails with one line (:class:`HealRefusedError`), which torchft records as the
  step's error (the step is not committed; the group stays out until a heal succeeds).

Who calls it: :func:`accelerando.backends.strategies.fault_tolerance.manager.start_manager` hands one to
torchft's ``Manager``, which calls the methods below from its quorum thread.
"""

from __future__ import annotations

import io
import logging
import threading
import urllib.request
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING

import torch

from accelerando.core.listeners import advertised_host, listening_socket

if TYPE_CHECKING:
    import socket

__all__ = ["HealRefusedError", "WeightsOnlyTransport"]

_log = logging.getLogger(__name__)


class HealRefusedError(RuntimeError):
    """A heal's reply held something other than weights (or could not be read); nothing of it was applied."""


class _Server(ThreadingHTTPServer):
    """An HTTP server on a socket bound beforehand (to one address, never the wildcard unless asked)."""

    daemon_threads = True

    def __init__(self, sock: socket.socket, handler: type[BaseHTTPRequestHandler]) -> None:
        super().__init__(sock.getsockname()[:2], handler, bind_and_activate=False)
        self.socket.close()
        self.socket = sock
        self.address_family = sock.family


class WeightsOnlyTransport:
    """A torchft checkpoint transport over HTTP, bound to ``bind`` and loading weights only.

    It has the methods of torchft's ``CheckpointTransport`` (which it does not subclass, so that this
    module imports without torchft).

    Args:
        bind: the address to serve on (the job's bind address).
        timeout: how long a request waits for the state to be ready, and a fetch for its reply.
    """

    def __init__(self, bind: str, timeout: timedelta) -> None:
        self._timeout = timeout
        self._ready = threading.Condition()
        self._step = -1
        self._payload: bytes | None = None
        transport = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                try:
                    self._answer()
                except ConnectionError:  # the peer gave up waiting (its own timeout): nothing to answer
                    pass

            def _answer(self) -> None:
                parts = self.path.strip("/").split("/")
                if (
                    len(parts) != 3
                    or parts[0] != "checkpoint"
                    or parts[2] != "full"
                    or not parts[1].isdigit()
                ):
                    self.send_error(400, "expected /checkpoint/<step>/full")
                    return
                payload = transport._wait_for(int(parts[1]))
                if payload is None:
                    self.send_error(409, f"step {parts[1]} is not served here")
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - http.server's name
                _log.debug("checkpoint server: " + format, *args)

        self._server = _Server(listening_socket(bind, 0), Handler)
        self._host = advertised_host(bind)
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="accelerando-heal", daemon=True
        )
        self._thread.start()

    def _wait_for(self, step: int) -> bytes | None:
        """The serialized state of ``step``, waiting (up to the timeout) until it is offered."""
        with self._ready:
            self._ready.wait_for(
                lambda: self._step == step and self._payload is not None, self._timeout.total_seconds()
            )
            return self._payload if self._step == step else None

    def metadata(self) -> str:
        """Where peers fetch this group's state: ``http://host:port/checkpoint/`` (the step follows)."""
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"http://{host}:{self._server.server_address[1]}/checkpoint/"

    def send_checkpoint(
        self, dst_ranks: list[int], step: int, state_dict: object, timeout: timedelta
    ) -> None:
        """Offer ``state_dict`` (moved to CPU) as the state of ``step`` until disallowed."""
        del (
            dst_ranks,
            timeout,
        )  # any recovering peer may fetch it; requests wait with this transport's timeout
        buffer = io.BytesIO()
        torch.save(_to_cpu(state_dict), buffer)
        with self._ready:
            self._step, self._payload = step, buffer.getvalue()
            self._ready.notify_all()

    def disallow_checkpoint(self) -> None:
        """Stop offering the state (the weights are about to change)."""
        with self._ready:
            self._step, self._payload = -1, None

    def recv_checkpoint(self, src_rank: int, metadata: str, step: int, timeout: timedelta) -> object:
        """Fetch the state of ``step`` from the peer at ``metadata`` and load it weights-only.

        Raises:
            HealRefusedError: the reply holds something other than tensors, numbers, strings and
                containers of them (nothing in it ran), or it cannot be fetched or read.
        """
        url = f"{metadata}{step}/full"
        try:
            with urllib.request.urlopen(url, timeout=timeout.total_seconds()) as reply:  # noqa: S310 - http only
                data = reply.read()
        except OSError as err:
            raise HealRefusedError(f"cannot fetch the weights to heal from {url}: {err}") from None
        try:
            state = torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
        except Exception as err:  # noqa: BLE001 - whatever the unpickler refused, nothing of it ran
            reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            message = (
                f"refused the heal from replica {src_rank} ({url}): its reply is not weights-only data, so "
                f"nothing of it was loaded ({reason})"
            )
            _log.error(message)
            raise HealRefusedError(message) from None
        return state

    def shutdown(self, wait: bool = True) -> None:
        """Stop the server (and wait for its thread when ``wait``)."""
        self._server.shutdown()
        self._server.server_close()
        if wait:
            self._thread.join()


def _to_cpu(value: object) -> object:
    """``value`` with every tensor copied to CPU (the reply is read on another machine's CPU)."""
    # torch 2.13: torch/utils/_pytree.py:1537 (private; map over a nested state dict)
    from torch.utils._pytree import tree_map

    return tree_map(lambda item: item.cpu() if isinstance(item, torch.Tensor) else item, value)
