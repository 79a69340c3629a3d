"""A multi-process test that times out says which ranks were still running and where they waited."""

from __future__ import annotations

import os
import time

import pytest

from accelerando.test_utils import DistributedTestError, run_distributed


def _rank_one_sleeps_in_a_named_function() -> int:
    if os.environ["RANK"] == "1":
        _wait_for_a_peer_that_never_comes()
    return 0


def _wait_for_a_peer_that_never_comes() -> None:
    time.sleep(120)


@pytest.mark.slow
def test_timeout_names_the_hung_rank_and_its_stack() -> None:
    with pytest.raises(DistributedTestError) as caught:
        run_distributed(_rank_one_sleeps_in_a_named_function, 2, timeout=10)
    message = str(caught.value)
    assert "still running: [1]" in message
    assert "rank 1 was waiting in" in message
    assert "_wait_for_a_peer_that_never_comes" in message
    assert "rank 0 was waiting" not in message
