"""Accelerator methods for experiment tracking and profiling (delegating to their modules)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

__all__ = ["ObservingMixin"]


class ObservingMixin:
    """init_trackers / log / get_tracker / end_training / profile."""

    state: Any
    project_configuration: Any
    _optimizers: list[Any]
    profile_handler: Any

    def _init_observing(self, log_with: Any) -> None:
        self._log_with = log_with
        self._tracking: Any = None
        if log_with is not None:
            self._tracking_manager()

    def _tracking_manager(self) -> Any:
        if self._tracking is None:
            from accelerando.tracking import TrackingManager

            self._tracking = TrackingManager(self._log_with, self.project_configuration.logging_dir)
        return self._tracking

    @property
    def trackers(self) -> list[Any]:
        """The trackers started by ``init_trackers`` (empty before)."""
        return [] if self._tracking is None else self._tracking.trackers

    def init_trackers(
        self,
        project_name: str,
        config: dict[str, Any] | None = None,
        init_kwargs: dict[str, Any] | None = None,
    ) -> None:
        """Start a run named ``project_name`` in every tracker of ``log_with`` (main process only,
        unless a tracker says otherwise), storing ``config`` as hyperparameters."""
        self._tracking_manager().init(project_name, config, init_kwargs)

    def log(
        self,
        values: dict[str, Any],
        step: int | None = None,
        log_kwargs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """Log ``values`` at ``step`` to every tracker (``reduce="mean"|"sum"|"max"`` aggregates across processes first)."""
        if self._tracking is None:
            return
        self._tracking.log(values, step, log_kwargs, **kwargs)

    def get_tracker(self, name: str, unwrap: bool = False) -> Any:
        """Return the tracker called ``name`` (its native run object with ``unwrap=True``)."""
        return self._tracking_manager().get(name, unwrap=unwrap)

    def enable_memory_monitor(self, window: int = 50, output_dir: str | None = None, **kwargs: Any) -> Any:
        """Record memory (RSS, device memory, NVML sensors) after every optimizer step.

        Samples go to the active trackers; a steady growth over ``window`` steps triggers one leak
        warning; ``end_training()`` writes ``memory_rank<k>.json`` (and a PNG timeline with
        matplotlib) into ``output_dir`` (default ``<project_dir>/memory`` when a project dir is set).
        Extra keyword arguments go to ``accelerando.monitoring.MemoryMonitor``. Returns the monitor.
        """
        import os

        from accelerando.monitoring.monitor import MemoryMonitor

        if output_dir is None and self.project_configuration.project_dir:
            output_dir = os.path.join(self.project_configuration.project_dir, "memory")
        self._memory_monitor = MemoryMonitor(
            trackers=self._tracking, window=window, output_dir=output_dir, **kwargs
        ).start()
        for optimizer in self._optimizers:
            optimizer._after_step = self._memory_monitor.step
        return self._memory_monitor

    def end_training(self) -> None:
        """Finish every tracker's run, stop the memory monitor, and wait for all processes."""
        monitor = getattr(self, "_memory_monitor", None)
        if monitor is not None:
            monitor.stop()
            self._memory_monitor = None
            for optimizer in self._optimizers:
                optimizer._after_step = None
        if self._tracking is not None:
            self._tracking.finish()
        self.state._partial.wait_for_everyone()

    @contextlib.contextmanager
    def profile(self, profile_handler: Any = None) -> Iterator[Any]:
        """Profile the block with torch.profiler (options from a ``ProfileKwargs``); yields the profiler.

        With ``output_trace_dir`` set, each process writes a Chrome trace there on exit.
        """
        from accelerando.monitoring.profiling import profile_context
        from accelerando.plugins.kwargs import ProfileKwargs

        handler = profile_handler or self.profile_handler or ProfileKwargs()
        with profile_context(handler, self.state.process_index) as prof:
            yield prof
