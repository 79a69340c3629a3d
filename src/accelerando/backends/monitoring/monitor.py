"""Memory and resource monitor: per-step memory samples, leak warning, JSON record and PNG timeline.

What the Accelerator (or a user) calls, in order::

    monitor = MemoryMonitor(trackers=tracking_manager, output_dir=".../memory")
    monitor.start()            # once, before the training loop (after prepare)
    monitor.step(step)         # once per optimizer step, on every process
    monitor.stop()             # once (end_training): writes the JSON record and the PNG plot

Each process samples itself: peak CPU RSS since the previous sample (Linux ``VmHWM``, reset after
each read), current RSS of the process and of its children, device memory allocated / reserved /
peak (CUDA, XPU, NPU where torch reports it), and through NVML (``nvidia-ml-py``) the GPU temperature,
power and utilisation. Sampling reads a few ``/proc`` files and allocator counters: tens of
microseconds per step, and nothing at all when no monitor is built. Trackers only write on the main
process, so they show rank 0's numbers; each process writes its own JSON record.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Protocol, TypeAlias, TypedDict, cast

from accelerando.backends.monitoring.profiling import MemoryProfileReport, profile_memory_step
from accelerando.backends.monitoring.readers import DeviceMemoryReader, ProcessMemoryReader
from accelerando.common import imports
from accelerando.logging import _process_view, get_logger

if TYPE_CHECKING:
    import torch

__all__ = ["MemoryMonitor", "MemorySummary", "linear_trend"]

logger = get_logger(__name__)

_MIB = 1024 * 1024


class Logs(Protocol):
    """What the monitor logs samples to: a ``TrackingManager`` or a ``GeneralTracker``."""

    def log(self, values: dict[str, object], step: int | None = None) -> object:
        """Record ``values`` at ``step``."""
        ...


#: Where samples go: something with ``log``, a list of trackers, or a callable ``fn(values, step)``.
Trackers: TypeAlias = Logs | Iterable[Logs] | Callable[[dict[str, object], int], object]


class LeakReport(TypedDict):
    """One steady growth found by the leak check."""

    metric: str
    step: float
    bytes_per_step: float
    growth_bytes: float
    r2: float
    steps_until_exhausted: int | None


class _SummaryCounts(TypedDict):
    samples: int
    leaks: list[LeakReport]


class MemorySummary(_SummaryCounts, total=False):
    """What :meth:`MemoryMonitor.summary` and :meth:`MemoryMonitor.stop` return.

    ``samples`` and ``leaks`` always; ``peak_<metric>`` / ``last_<metric>`` for each metric sampled
    (a metric the device does not report is absent); ``json_path`` / ``png_path`` from ``stop`` when
    it wrote them.
    """

    peak_cpu_rss: float
    last_cpu_rss: float
    peak_cpu_rss_peak: float
    last_cpu_rss_peak: float
    peak_children_rss: float
    last_children_rss: float
    peak_device_allocated: float
    last_device_allocated: float
    peak_device_reserved: float
    last_device_reserved: float
    peak_device_peak: float
    last_device_peak: float
    peak_gpu_temperature_c: float
    last_gpu_temperature_c: float
    peak_gpu_power_w: float
    last_gpu_power_w: float
    peak_gpu_utilization_pct: float
    last_gpu_utilization_pct: float
    json_path: str
    png_path: str


def linear_trend(values: Sequence[float]) -> tuple[float, float]:
    """Fit ``values[i] ~ a + slope * i`` by least squares.

    Args:
        values: equally spaced samples (at least two).

    Returns:
        ``(slope, r_squared)``; ``r_squared`` is 0 for a constant series.
    """
    n = len(values)
    mean_x = (n - 1) / 2
    mean_y = sum(values) / n
    sxx = sum((i - mean_x) ** 2 for i in range(n))
    sxy = sum((i - mean_x) * (v - mean_y) for i, v in enumerate(values))
    syy = sum((v - mean_y) ** 2 for v in values)
    if sxx == 0 or syy == 0:
        return 0.0, 0.0
    slope = sxy / sxx
    return slope, (sxy * sxy) / (sxx * syy)


class MemoryMonitor:
    """Record memory (and GPU sensors) once per step, warn on steady growth, write a record at the end.

    Args:
        trackers: where to log each sample: a :class:`~accelerando.tracking.TrackingManager`, a list
            of trackers, or a callable ``fn(values, step)``; ``None`` logs nowhere.
        window: number of recent samples examined by the leak check.
        output_dir: folder for ``memory_rank<k>.json`` and ``memory_rank<k>.png`` (nothing is written
            when ``None``).
        sample_every: take a sample every this many ``step()`` calls.
        log_every: send every this many samples to the trackers (every sample is kept in the JSON
            record; some trackers, e.g. MLflow with a database store, cost milliseconds per write).
        leak_min_growth_mb: growth over the window (MiB) below which no leak is reported.
        leak_min_r2: how straight the growth must be (R^2 of a linear fit, 0..1) to count as steady.
        nvml_every: read NVML sensors every this many samples (they cost more than counters).
        children_refresh_s: re-list child processes (dataloader workers, ...) at most this often,
            in seconds; listing them scans /proc and costs milliseconds.
        plot: write the PNG timeline at ``stop()`` when matplotlib is installed.
        prefix: key prefix of the logged metrics.

    Raises:
        ValueError: a non-positive window or period, or ``leak_min_r2`` outside [0, 1].
    """

    _RATE_KEYS = ("sample_every", "log_every", "nvml_every")

    def __init__(
        self,
        trackers: Trackers | None = None,
        window: int = 50,
        output_dir: str | os.PathLike[str] | None = None,
        *,
        sample_every: int = 1,
        log_every: int = 10,
        leak_min_growth_mb: float = 32.0,
        leak_min_r2: float = 0.9,
        nvml_every: int = 10,
        children_refresh_s: float = 30.0,
        plot: bool = True,
        prefix: str = "memory/",
    ) -> None:
        periods = dict(zip(self._RATE_KEYS, (sample_every, log_every, nvml_every), strict=True))
        for name, value in {"window": window, **periods}.items():
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"MemoryMonitor {name} must be a positive int, got {value!r}.")
        if window < 3:
            raise ValueError(f"MemoryMonitor window must be at least 3 samples to fit a trend, got {window}.")
        if not 0.0 <= leak_min_r2 <= 1.0:
            raise ValueError(f"leak_min_r2 is an R^2 between 0 and 1, got {leak_min_r2}.")
        self.trackers = trackers
        self.window = window
        self.output_dir = os.fspath(output_dir) if output_dir is not None else None
        self.periods = periods
        self.leak_min_growth_bytes = leak_min_growth_mb * _MIB
        self.leak_min_r2 = leak_min_r2
        self.children_refresh_s = float(children_refresh_s)
        self._children_at = 0.0
        self.plot = plot
        self.prefix = prefix
        self.records: list[dict[str, float]] = []
        self.leaks: list[LeakReport] = []
        self._calls = 0
        self._sensors: dict[str, float] = {}
        self._proc: ProcessMemoryReader | None = None
        self._device: DeviceMemoryReader | None = None
        self._t0 = 0.0
        self.rank = _process_view().rank

    @property
    def running(self) -> bool:
        """Whether ``start()`` was called and ``stop()`` not yet."""
        return self._proc is not None

    def start(self) -> MemoryMonitor:
        """Open the readers and reset the peak counters; returns ``self``."""
        self._proc = ProcessMemoryReader()
        self._proc.refresh_children()
        self._children_at = time.perf_counter()
        self._proc.rss_and_peak()
        self._device = DeviceMemoryReader(use_nvml=True)
        self._device.memory()
        self._t0 = time.perf_counter()
        self._calls = 0
        return self

    def step(self, step: int | None = None) -> dict[str, float] | None:
        """Take a sample (every ``sample_every`` calls), log it, and run the leak check.

        Args:
            step: the training step to attach the sample to (defaults to the call count).

        Returns:
            The sample (bytes, watts, degrees, percent), or ``None`` when this call was not sampled.

        Raises:
            RuntimeError: ``start()`` was not called.
        """
        if self._proc is None or self._device is None:
            raise RuntimeError("MemoryMonitor.step() called before start(); call monitor.start() first.")
        self._calls += 1
        if (self._calls - 1) % self.periods["sample_every"]:
            return None
        sample_index = len(self.records)
        now = time.perf_counter()
        if now - self._children_at >= self.children_refresh_s:
            self._proc.refresh_children()
            self._children_at = now
        rss, peak = self._proc.rss_and_peak()
        record: dict[str, float] = {
            "step": self._calls - 1 if step is None else step,
            "time_s": now - self._t0,
            "cpu_rss": rss,
            "cpu_rss_peak": peak,
            "children_rss": self._proc.children_rss(),
        }
        record.update(self._device.memory())
        if sample_index % self.periods["nvml_every"] == 0:
            self._sensors = self._device.sensors()
        record.update(self._sensors)
        self.records.append(record)
        if sample_index % self.periods["log_every"] == 0:
            self._log(record)
        if len(self.records) >= self.window and sample_index % max(1, self.window // 4) == 0:
            self._check_leaks()
        return record

    def _log(self, record: dict[str, float]) -> None:
        trackers = self.trackers
        if trackers is None:
            return
        values: dict[str, object] = {
            f"{self.prefix}{k}": v for k, v in record.items() if k not in ("step", "time_s")
        }
        step = int(record["step"])  # the step argument or the call count: an int
        log = getattr(trackers, "log", None)
        if callable(log):
            log(values, step=step)
        elif callable(trackers):
            trackers(values, step)
        elif isinstance(trackers, Iterable):
            for tracker in trackers:
                if not getattr(tracker, "main_process_only", True) or self.rank == 0:
                    tracker.log(values, step=step)
        else:
            raise TypeError(f"MemoryMonitor trackers: {type(trackers).__name__!r} object is not iterable")

    def _check_leaks(self) -> None:
        recent = self.records[-self.window :]
        for key in ("cpu_rss", "device_allocated"):
            if key in {leak["metric"] for leak in self.leaks} or key not in recent[-1]:
                continue
            series = [float(r.get(key, 0)) for r in recent]
            slope, r2 = linear_trend(series)
            growth = slope * (len(series) - 1)
            if growth < self.leak_min_growth_bytes or r2 < self.leak_min_r2:
                continue
            leak: LeakReport = {
                "metric": key,
                "step": recent[-1]["step"],
                "bytes_per_step": slope,
                "growth_bytes": growth,
                "r2": r2,
                "steps_until_exhausted": self._steps_left(key, slope),
            }
            self.leaks.append(leak)
            horizon = leak["steps_until_exhausted"]
            logger.warning(
                f"MemoryMonitor (rank {self.rank}): possible memory leak: {key} grew steadily by "
                f"{growth / _MIB:.1f} MiB over the last {len(series)} samples ({slope / _MIB:.2f} MiB/step, "
                f"R^2={r2:.2f})"
                + (
                    f"; at this rate memory runs out in about {horizon} steps."
                    if horizon is not None
                    else "."
                )
                + " Look for tensors kept across steps (e.g. appending a loss without .item()).",
                main_process_only=False,
            )

    def _steps_left(self, key: str, slope: float) -> int | None:
        if slope <= 0:
            return None
        if key == "cpu_rss":
            import psutil

            return int(psutil.virtual_memory().available / slope)
        total = self._device.backend.total_memory() if self._device is not None else None
        if not total:
            return None
        return int(max(total - self.records[-1].get("device_reserved", 0), 0) / slope)

    def summary(self) -> MemorySummary:
        """Peaks and last values over all samples, plus the leak reports.

        Returns:
            ``{"samples", "peak_<metric>", "last_<metric>", "leaks"}`` (see :class:`MemorySummary`).
        """
        out = MemorySummary(samples=len(self.records), leaks=list(self.leaks))
        values_of = cast("dict[str, float]", out)  # the metric keys are only known once sampled
        if self.records:
            keys = [k for k in self.records[-1] if k not in ("step", "time_s")]
            for key in keys:
                values = [r[key] for r in self.records if key in r]
                values_of[f"peak_{key}"] = max(values)
                values_of[f"last_{key}"] = values[-1]
        return out

    def stop(self) -> MemorySummary:
        """Close the readers and write ``memory_rank<k>.json`` (and ``.png``) into ``output_dir``.

        Returns:
            The :meth:`summary`, with ``json_path`` / ``png_path`` when files were written.
        """
        if self._device is not None:
            self._device.close()
        if self._proc is not None:
            self._proc.close()
        self._proc = None
        self._device = None
        result = self.summary()
        if self.output_dir is None:
            return result
        os.makedirs(self.output_dir, exist_ok=True)
        json_path = os.path.join(self.output_dir, f"memory_rank{self.rank}.json")
        with open(json_path, "w", encoding="utf-8") as handle:
            json.dump({"rank": self.rank, "summary": result, "records": self.records}, handle, indent=1)
        result["json_path"] = json_path
        if self.plot and self.records:
            png_path = _plot_timeline(
                self.records, os.path.join(self.output_dir, f"memory_rank{self.rank}.png")
            )
            if png_path is not None:
                result["png_path"] = png_path
        return result

    def profile_step(
        self,
        function: Callable[..., object],
        *args: object,
        model: torch.nn.Module | None = None,
        top_k: int = 10,
        snapshot_path: str | os.PathLike[str] | None = None,
        **kwargs: object,
    ) -> MemoryProfileReport:
        """Run one step under the memory profiler; see :func:`accelerando.backends.monitoring.profiling.profile_memory_step`."""
        return profile_memory_step(
            function, *args, model=model, top_k=top_k, snapshot_path=snapshot_path, **kwargs
        )

    def __enter__(self) -> MemoryMonitor:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _plot_timeline(records: list[dict[str, float]], path: str) -> str | None:
    # The package checks are generated in accelerando.common.imports, out of static analysis' sight.
    is_matplotlib_available: Callable[[], bool] = getattr(imports, "is_matplotlib_available")  # noqa: B009
    if not is_matplotlib_available():
        logger.warning(
            "MemoryMonitor: matplotlib is not installed, no PNG timeline (`pip install matplotlib`)."
        )
        return None
    # Figure (not pyplot) draws off-screen without touching the user's matplotlib backend.
    from matplotlib.figure import Figure

    steps = [r["step"] for r in records]
    sensors = [k for k in ("gpu_temperature_c", "gpu_power_w", "gpu_utilization_pct") if k in records[-1]]
    fig = Figure(figsize=(9, 6 if sensors else 4))
    axes = fig.subplots(2 if sensors else 1, 1, squeeze=False)
    memory_axis = axes[0][0]
    for key in (
        "cpu_rss",
        "cpu_rss_peak",
        "children_rss",
        "device_allocated",
        "device_reserved",
        "device_peak",
    ):
        if key in records[-1]:
            memory_axis.plot(steps, [r.get(key, math.nan) / _MIB for r in records], label=key)
    memory_axis.set_ylabel("MiB")
    memory_axis.set_title("Memory per step")
    memory_axis.legend(loc="upper left", fontsize="small")
    if sensors:
        for key in sensors:
            axes[1][0].plot(steps, [r.get(key, math.nan) for r in records], label=key)
        axes[1][0].legend(loc="upper left", fontsize="small")
    axes[-1][0].set_xlabel("step")
    fig.tight_layout()
    fig.savefig(path)
    return path
