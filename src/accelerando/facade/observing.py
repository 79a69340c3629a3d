"""Experiment tracking, memory monitoring and profiling of one Accelerator (delegating to their modules)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Literal, overload

from accelerando.facade.context import ServiceContext

if TYPE_CHECKING:
    import torch

    from accelerando.backends.monitoring.monitor import MemoryMonitor
    from accelerando.plugins.kwargs import ProfileKwargs
    from accelerando.tracking import GeneralTracker, TrackingManager

__all__ = ["Observability"]


class Observability:
    """init_trackers / log / get_tracker / end_training / memory monitor / profile.

    Args:
        context: the Accelerator's shared services record: the process view (process index,
            waiting for every process), the options (the project configuration's folders) and the
            registry (the prepared optimizers, which the memory monitor samples after each step).
        log_with: tracker name(s), ``GeneralTracker`` instance(s) or "all"; None for no trackers.
        profile_handler: the ``ProfileKwargs`` given in code, or None.
    """

    def __init__(
        self, context: ServiceContext, log_with: object = None, profile_handler: ProfileKwargs | None = None
    ) -> None:
        self.state = context.state
        self.options = context.options
        self.registry = context.registry
        self.log_with = log_with
        self.profile_handler = profile_handler
        self.tracking: TrackingManager | None = None
        self.memory_monitor: MemoryMonitor | None = None
        if log_with is not None:
            self._tracking_manager()

    def _tracking_manager(self) -> TrackingManager:
        if self.tracking is None:
            from accelerando.tracking import TrackingManager

            self.tracking = TrackingManager(self.log_with, self.options.project_configuration.logging_dir)
        return self.tracking

    @property
    def trackers(self) -> list[GeneralTracker]:
        """The trackers started by ``init_trackers`` (empty before)."""
        return [] if self.tracking is None else self.tracking.trackers

    def init_trackers(
        self,
        project_name: str,
        config: dict[str, object] | None = None,
        init_kwargs: dict[str, dict[str, object]] | None = None,
    ) -> None:
        """Start a run named ``project_name`` in every tracker of ``log_with`` (main process only,
        unless a tracker says otherwise), storing ``config`` as hyperparameters.

        Example:
            >>> # with Accelerator(log_with="tensorboard", project_dir="runs")
            >>> accelerator.init_trackers("my_project", config={"learning_rate": 1e-3})
        """
        self._tracking_manager().init(project_name, config, init_kwargs)

    def log(
        self,
        values: dict[str, object],
        step: int | None = None,
        log_kwargs: dict[str, dict[str, object]] | None = None,
        *,
        reduce: str | None = None,
    ) -> None:
        """Log ``values`` at ``step`` to every tracker (``reduce="mean"|"sum"|"max"`` aggregates across processes first).

        Example:
            >>> accelerator.log({"train_loss": 0.25, "learning_rate": 1e-3}, step=10)
        """
        if self.tracking is None:
            return
        self.tracking.log(values, step, log_kwargs, reduce=reduce)

    @overload
    def get_tracker(self, name: str, unwrap: Literal[False] = False) -> GeneralTracker: ...
    # Any: with unwrap=True the backend's own object (a W&B run, a SummaryWriter...), whose methods the
    # user calls; its type belongs to a library this module never imports.
    @overload
    def get_tracker(self, name: str, unwrap: bool) -> Any: ...
    def get_tracker(self, name: str, unwrap: bool = False) -> object:
        """Return the tracker called ``name`` (its native run object with ``unwrap=True``).

        Raises:
            ValueError: trackers exist but none is called ``name``.

        Example:
            >>> accelerator.get_tracker("tensorboard").log({"loss": 0.5}, step=1)  # doctest: +SKIP
            >>> writer = accelerator.get_tracker("tensorboard", unwrap=True)  # doctest: +SKIP
        """
        return self._tracking_manager().get(name, unwrap=unwrap)

    def log_checkpoint(self, path: str, size: int) -> None:
        """Report a written checkpoint to the trackers (nothing without trackers).

        The step is the script's own: the one its last ``log`` call gave (None when it gave none, so
        that each tracker uses its own counter, as for the script's values); never
        ``accelerator.step``, which counts micro-batches and restarts each epoch.
        """
        manager = self.tracking
        if manager is not None:
            manager.log_checkpoint(manager.last_step, path, size)

    def enable_memory_monitor(
        # Any: MemoryMonitor's own keyword options, passed on as given.
        self,
        window: int = 50,
        output_dir: str | None = None,
        **kwargs: Any,
    ) -> MemoryMonitor:
        """Record memory (RSS, device memory, NVML sensors) after every optimizer step.

        Samples go to the active trackers; a steady growth over ``window`` steps triggers one leak
        warning; ``end_training()`` writes ``memory_rank<k>.json`` (and a PNG timeline with
        matplotlib) into ``output_dir`` (default ``<project_dir>/memory`` when a project dir is set).
        Extra keyword arguments go to ``accelerando.backends.monitoring.MemoryMonitor``. Returns the monitor.

        Example:
            >>> monitor = accelerator.enable_memory_monitor(window=20)
            >>> # ... training steps; accelerator.end_training() then writes the report
        """
        from accelerando.backends.monitoring.monitor import MemoryMonitor

        project_dir = self.options.project_configuration.project_dir
        if output_dir is None and project_dir:
            output_dir = os.path.join(project_dir, "memory")
        monitor = MemoryMonitor(
            trackers=self.tracking, window=window, output_dir=output_dir, **kwargs
        ).start()
        self.memory_monitor = monitor
        self.registry.set_after_optimizer_step(monitor.step)
        return monitor

    def end_training(self) -> None:
        """Finish every tracker's run, stop the memory monitor, and wait for all processes.

        Example:
            >>> accelerator.end_training()  # after the last step, on every process
        """
        monitor = self.memory_monitor
        if monitor is not None:
            monitor.stop()
            self.memory_monitor = None
            self.registry.set_after_optimizer_step(None)
        if self.tracking is not None:
            self.tracking.finish()
        self.state._partial.wait_for_everyone()

    @contextlib.contextmanager
    def profile(self, profile_handler: ProfileKwargs | None = None) -> Iterator[torch.profiler.profile]:
        """Profile the block with torch.profiler (options from a ``ProfileKwargs``); yields the profiler.

        With ``output_trace_dir`` set, each process writes a Chrome trace there on exit.

        Example:
            >>> with accelerator.profile() as profiler:
            ...     out = model(torch.randn(2, 4))
            >>> table = profiler.key_averages().table(row_limit=5)
        """
        from accelerando.backends.monitoring.profiling import profile_context
        from accelerando.plugins.kwargs import ProfileKwargs

        handler = profile_handler or self.profile_handler or ProfileKwargs()
        with profile_context(handler, self.state.process_index) as prof:
            yield prof
