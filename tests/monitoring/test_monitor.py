"""MemoryMonitor (leak warning, records vs psutil, JSON/PNG output) and the profiling helpers."""

from __future__ import annotations

import importlib.util
import json
import logging
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch

from accelerando.backends.monitoring import MemoryMonitor, linear_trend
from accelerando.backends.monitoring.profiling import profile_context, profile_memory_step
from accelerando.plugins.kwargs import ProfileKwargs

_MIB = 1 << 20


class ListTracker:
    name = "list"
    main_process_only = True

    def __init__(self) -> None:
        self.logged: list[tuple[dict[str, Any], int | None]] = []

    def log(self, values: dict[str, Any], step: int | None = None) -> None:
        self.logged.append((values, step))


def test_linear_trend() -> None:
    assert linear_trend([1.0, 3.0, 5.0, 7.0]) == (2.0, 1.0)
    assert linear_trend([4.0, 4.0, 4.0]) == (0.0, 0.0)


def test_leaking_loop_warns_once_and_files_are_written(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="accelerando.backends.monitoring")
    tracker = ListTracker()
    monitor = MemoryMonitor(
        trackers=[tracker], window=16, output_dir=tmp_path, leak_min_growth_mb=16, log_every=1
    ).start()
    kept = []
    for step in range(40):
        kept.append(torch.ones(512 * 1024))  # 2 MiB kept per step: a leak
        record = monitor.step(step)
    assert abs(record["cpu_rss"] - psutil.Process().memory_info().rss) < 16 * _MIB
    assert record["cpu_rss_peak"] >= record["cpu_rss"]
    summary = monitor.stop()
    (leak,) = summary["leaks"]
    assert leak["metric"] == "cpu_rss" and leak["r2"] > 0.9
    assert 1.5 * _MIB < leak["bytes_per_step"] < 2.6 * _MIB
    warnings = [r.getMessage() for r in caplog.records if "possible memory leak" in r.getMessage()]
    assert len(warnings) == 1 and "MiB/step" in warnings[0]
    saved = json.loads(Path(summary["json_path"]).read_text())
    assert len(saved["records"]) == 40 and saved["summary"]["leaks"][0]["metric"] == "cpu_rss"
    if importlib.util.find_spec("matplotlib") is not None:
        assert Path(summary["png_path"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(tracker.logged) == 40 and tracker.logged[-1][1] == 39
    assert "memory/cpu_rss" in tracker.logged[-1][0]


def test_steady_loop_does_not_warn_and_peak_sees_transients() -> None:
    monitor = MemoryMonitor(window=8, leak_min_growth_mb=16).start()
    peaks = []
    for step in range(24):
        # 64 MiB allocated and freed inside the step; above glibc's largest mmap threshold (32 MiB),
        # so the pages really go back to the system when freed.
        transient = torch.ones(16 * 1024 * 1024)
        del transient
        peaks.append(monitor.step(step)["cpu_rss_peak"] - monitor.records[-1]["cpu_rss"])
    assert monitor.stop()["leaks"] == []
    # the per-step peak includes the freed 64 MiB although the RSS after the step does not
    assert sum(p >= 48 * _MIB for p in peaks) >= 20


def test_sampling_period_and_errors() -> None:
    monitor = MemoryMonitor(window=4, sample_every=5)
    with pytest.raises(RuntimeError, match="start"):
        monitor.step()
    monitor.start()
    sampled = [monitor.step() is not None for _ in range(20)]
    assert sum(sampled) == 4 and sampled[0]
    monitor.stop()
    with pytest.raises(ValueError, match="window"):
        MemoryMonitor(window=0)
    with pytest.raises(ValueError, match="leak_min_r2"):
        MemoryMonitor(leak_min_r2=2.0)


def test_profile_memory_step_names_modules_and_ops_and_profile_context_writes_trace(tmp_path: Path) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(64, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 4))

    def train_step(batch: torch.Tensor) -> float:
        loss = model(batch).sum()
        loss.backward()
        return loss.item()

    report = profile_memory_step(train_step, torch.randn(256, 64), model=model, top_k=3)
    assert isinstance(report.result, float)
    # the 256 x 2048 float activations (2 MiB) of the first Linear are the biggest forward allocation
    biggest = max(report.modules[1:], key=lambda row: row["cpu_memory_bytes"])
    assert biggest["name"] in ("0", "1") and biggest["cpu_memory_bytes"] >= 2 * _MIB
    assert len(report.ops) == 3 and report.ops[0]["cpu_memory_bytes"] >= 2 * _MIB
    assert "module" in report.table() and "operator" in report.table()

    kwargs = ProfileKwargs(activities=["cpu"], record_shapes=True, output_trace_dir=str(tmp_path))
    with profile_context(kwargs, process_index=3):
        train_step(torch.randn(4, 64))
    trace = json.loads((tmp_path / "profile_3.json").read_text())
    assert any("addmm" in event.get("name", "") for event in trace["traceEvents"])
    with pytest.raises(ValueError, match="activities"):
        with profile_context(ProfileKwargs(activities=["gpu"])):
            pass
