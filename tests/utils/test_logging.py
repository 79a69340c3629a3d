"""get_logger in one process: main-process gating through the launcher's rank, levels from the environment."""

from __future__ import annotations

import logging

import pytest

from accelerando.logging import get_logger
from accelerando.utils import tqdm


def _capture(name: str, caplog: pytest.LogCaptureFixture, level: str = "INFO"):
    caplog.set_level(logging.DEBUG, logger=name)
    return get_logger(name, log_level=level)


def test_logs_before_any_state_as_single_process(caplog: pytest.LogCaptureFixture, monkeypatch) -> None:
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    logger = _capture("obs.single", caplog)
    logger.info("hello")
    logger.info("everyone", main_process_only=False, in_order=True)
    logger.debug("hidden")
    assert [r.getMessage() for r in caplog.records] == ["hello", "everyone"]
    assert caplog.records[0].filename == "test_logging.py"


def test_non_main_rank_is_silent_by_default(caplog: pytest.LogCaptureFixture, monkeypatch) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    logger = _capture("obs.rank1", caplog)
    logger.warning("main only")
    logger.warning("all ranks", main_process_only=False)
    logger.warning_once("once", main_process_only=False)
    logger.warning_once("once", main_process_only=False)
    assert [r.getMessage() for r in caplog.records] == ["all ranks", "once"]


def test_level_from_environment(monkeypatch) -> None:
    monkeypatch.setenv("ACCELERANDO_LOG_LEVEL", "DEBUG")
    assert get_logger("obs.env1").logger.level == logging.DEBUG
    monkeypatch.delenv("ACCELERANDO_LOG_LEVEL")
    monkeypatch.setenv("ACCELERATE_LOG_LEVEL", "error")
    assert get_logger("obs.env2").logger.level == logging.ERROR
    assert get_logger("obs.env3", log_level="WARNING").logger.level == logging.WARNING


def test_bad_level_and_flags() -> None:
    with pytest.raises(ValueError, match="ACCELERANDO_LOG_LEVEL"):
        get_logger("obs.bad", log_level="LOUD")
    with pytest.raises(TypeError, match="main_process_only"):
        get_logger("obs.bad2").warning("x", main_process_only="yes")


def test_tqdm_main_process_only(monkeypatch) -> None:
    pytest.importorskip("tqdm", reason="tqdm is not installed (pip install tqdm)")
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert not tqdm(range(3)).disable
    monkeypatch.setenv("LOCAL_RANK", "1")
    bar = tqdm(range(3))
    assert bar.disable and list(bar) == [0, 1, 2]
    assert not tqdm(range(3), main_process_only=False).disable
    with pytest.raises(TypeError, match="main_process_only"):
        tqdm(True, range(3))
