"""Which failed process the launcher names first when one process is killed and its peer then raises."""

from __future__ import annotations

import signal
from types import SimpleNamespace

from accelerando.launchers.runner import _first_failure


def _failures(kill_seconds_after: int, message: str) -> tuple[SimpleNamespace, dict]:
    raised_ns = 1_000 * 1_000_000_000
    err = SimpleNamespace(
        failures={
            0: SimpleNamespace(exitcode=-signal.SIGTERM, timestamp=1_000 + kill_seconds_after + 1),
            1: SimpleNamespace(exitcode=-signal.SIGKILL, timestamp=1_000 + kill_seconds_after),
        }
    )
    records = {0: {"time_ns": raised_ns, "message": message}}
    return err, records


def test_a_kill_seen_late_is_blamed_before_the_peer_whose_collective_lost_it() -> None:
    err, records = _failures(2, "[pair.cc:553] Connection closed by peer [127.0.0.1]:40605")
    assert _first_failure(err, records)[0] == 1


def test_an_ordinary_exception_raised_earlier_is_still_the_cause() -> None:
    err, records = _failures(2, "ValueError: bad batch")
    assert _first_failure(err, records)[0] == 0
