"""torch.profiler helpers: the context behind ``Accelerator.profile()`` and a one-step memory profile.

``Accelerator.profile(profile_handler=None)`` is expected to be::

    with profile_context(profile_handler or self._profile_kwargs, self.process_index) as prof:
        yield prof

:func:`profile_memory_step` runs one step with memory profiling and names the modules and operators
that allocate most; on CUDA it can also save an allocator snapshot for PyTorch's memory visualizer
(https://pytorch.org/memory_viz).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypedDict

import torch

from accelerando.common.constants import PROFILE_PATTERN_NAME
from accelerando.logging import get_logger

if TYPE_CHECKING:
    from collections.abc import Iterable

    from torch.autograd.profiler_util import FunctionEventAvg
    from torch.utils.hooks import RemovableHandle

    from accelerando.plugins.kwargs import ProfileKwargs

__all__ = ["MemoryProfileReport", "build_profiler", "profile_context", "profile_memory_step"]

logger = get_logger(__name__)

_TRACE_NAME = PROFILE_PATTERN_NAME


def _activities(names: list[str] | None) -> list[torch.profiler.ProfilerActivity] | None:
    if names is None:
        return None
    available = {name.lower(): a for name, a in torch.profiler.ProfilerActivity.__members__.items()}
    unknown = [name for name in names if str(name).lower() not in available]
    if unknown:
        raise ValueError(f"Unknown profiler activities {unknown}; choose from {sorted(available)}.")
    return [available[str(name).lower()] for name in names]


def _trace_exporter(directory: str, process_index: int) -> Callable[[torch.profiler.profile], None]:
    def export(prof: torch.profiler.profile) -> None:
        name = f"profile_{process_index}_step{prof.step_num}.json"
        prof.export_chrome_trace(os.path.join(directory, name))

    return export


def build_profiler(
    profile_kwargs: ProfileKwargs | None = None, process_index: int = 0
) -> torch.profiler.profile:
    """Create a ``torch.profiler.profile`` from a :class:`~accelerando.utils.ProfileKwargs`.

    Args:
        profile_kwargs: a ``ProfileKwargs`` (or any object with its fields); ``None`` uses defaults.
        process_index: this process's rank, used to name trace files.

    Returns:
        An un-entered ``torch.profiler.profile``.

    Raises:
        ValueError: an unknown activity name.
    """
    schedule_option = getattr(profile_kwargs, "schedule_option", None)
    on_trace_ready = getattr(profile_kwargs, "on_trace_ready", None)
    trace_dir = getattr(profile_kwargs, "output_trace_dir", None)
    if schedule_option and trace_dir and on_trace_ready is None:
        # With a schedule, traces are produced per cycle; export each, one file per process and cycle.
        os.makedirs(trace_dir, exist_ok=True)
        on_trace_ready = _trace_exporter(trace_dir, process_index)
    return torch.profiler.profile(
        activities=_activities(getattr(profile_kwargs, "activities", None)),
        schedule=torch.profiler.schedule(**schedule_option) if schedule_option else None,
        on_trace_ready=on_trace_ready,
        record_shapes=bool(getattr(profile_kwargs, "record_shapes", False)),
        profile_memory=bool(getattr(profile_kwargs, "profile_memory", False)),
        with_stack=bool(getattr(profile_kwargs, "with_stack", False)),
        with_flops=bool(getattr(profile_kwargs, "with_flops", False)),
        with_modules=bool(getattr(profile_kwargs, "with_modules", False)),
    )


@contextlib.contextmanager
def profile_context(
    profile_kwargs: ProfileKwargs | None = None, process_index: int = 0
) -> Iterator[torch.profiler.profile]:
    """Profile the enclosed code; with ``output_trace_dir``, write a Chrome trace per process.

    Without a schedule the trace is written on exit as ``<output_trace_dir>/profile_<rank>.json``;
    with ``schedule_option`` each completed cycle is written as ``profile_<rank>_step<n>.json``
    (unless ``on_trace_ready`` is given). Open traces in ``chrome://tracing`` or Perfetto.

    Args:
        profile_kwargs: a :class:`~accelerando.utils.ProfileKwargs`; ``None`` uses defaults.
        process_index: this process's rank.

    Yields:
        The running ``torch.profiler.profile`` (call ``prof.step()`` each step when using a schedule).

    Raises:
        ValueError: an unknown activity name.
    """
    profiler = build_profiler(profile_kwargs, process_index)
    with profiler as prof:
        yield prof
    trace_dir = getattr(profile_kwargs, "output_trace_dir", None)
    if trace_dir and not getattr(profile_kwargs, "schedule_option", None):
        os.makedirs(trace_dir, exist_ok=True)
        prof.export_chrome_trace(os.path.join(trace_dir, _TRACE_NAME.format(suffix=process_index)))


class MemoryRow(TypedDict):
    """One module or operator of a :class:`MemoryProfileReport` (bytes allocated, number of calls)."""

    name: str
    cpu_memory_bytes: int
    device_memory_bytes: int
    calls: int


@dataclass
class MemoryProfileReport:
    """What one profiled step allocated, largest first.

    Attributes:
        modules: ``{"name", "cpu_memory_bytes", "device_memory_bytes", "calls"}`` per module forward
            (inclusive of its children), when a model was given.
        ops: ``{"name", "cpu_memory_bytes", "device_memory_bytes", "calls"}`` per operator (self
            memory: what the operator itself allocated).
        snapshot_path: the CUDA allocator snapshot, when one was written.
        result: what the profiled function returned.
    """

    modules: list[MemoryRow] = field(default_factory=list[MemoryRow])
    ops: list[MemoryRow] = field(default_factory=list[MemoryRow])
    snapshot_path: str | None = None
    result: object = None

    def table(self) -> str:
        """A plain-text table of the top modules and operators (MiB)."""
        lines = []
        for title, rows in (("module", self.modules), ("operator", self.ops)):
            if not rows:
                continue
            lines.append(f"{title:<48} {'cpu MiB':>10} {'device MiB':>11} {'calls':>6}")
            for row in rows:
                lines.append(
                    f"{row['name'][:48]:<48} {row['cpu_memory_bytes'] / 2**20:>10.2f} "
                    f"{row['device_memory_bytes'] / 2**20:>11.2f} {row['calls']:>6}"
                )
            lines.append("")
        if self.snapshot_path:
            lines.append(
                f"CUDA allocator snapshot: {self.snapshot_path} (open it at https://pytorch.org/memory_viz)"
            )
        return "\n".join(lines)


_MODULE_LABEL = "module::"


def _label_modules(model: torch.nn.Module) -> list[RemovableHandle]:
    """Wrap each submodule's forward in a profiler range named after the module's path."""
    open_ranges: list[torch.profiler.record_function] = []
    handles: list[RemovableHandle] = []
    for name, module in model.named_modules():
        label = f"{_MODULE_LABEL}{name or type(model).__name__}"

        def enter(_module: torch.nn.Module, _inputs: tuple[object, ...], label: str = label) -> None:
            scope = torch.profiler.record_function(label)
            scope.__enter__()
            open_ranges.append(scope)

        def leave(_module: torch.nn.Module, _inputs: tuple[object, ...], _outputs: object) -> None:
            if open_ranges:
                open_ranges.pop().__exit__(None, None, None)

        handles.append(module.register_forward_pre_hook(enter))
        handles.append(module.register_forward_hook(leave))
    return handles


def _device_memory(event: FunctionEventAvg, self_only: bool) -> int:
    prefix = "self_" if self_only else ""
    for attr in (f"{prefix}device_memory_usage", f"{prefix}cuda_memory_usage"):
        if hasattr(event, attr):
            return int(getattr(event, attr) or 0)
    return 0


def _rows(events: Iterable[FunctionEventAvg], top_k: int) -> tuple[list[MemoryRow], list[MemoryRow]]:
    modules: list[MemoryRow] = []
    ops: list[MemoryRow] = []
    for event in events:
        assert event.key is not None  # key_averages() groups the events by their (str) key
        if event.key.startswith(_MODULE_LABEL):
            row: MemoryRow = {
                "name": event.key[len(_MODULE_LABEL) :],
                "cpu_memory_bytes": int(event.cpu_memory_usage),
                "device_memory_bytes": _device_memory(event, self_only=False),
                "calls": int(event.count),
            }
            modules.append(row)
        else:
            row = {
                "name": event.key,
                "cpu_memory_bytes": int(event.self_cpu_memory_usage),
                "device_memory_bytes": _device_memory(event, self_only=True),
                "calls": int(event.count),
            }
            if row["cpu_memory_bytes"] > 0 or row["device_memory_bytes"] > 0:
                ops.append(row)

    def size(row: MemoryRow) -> int:
        return max(row["cpu_memory_bytes"], row["device_memory_bytes"])

    return sorted(modules, key=size, reverse=True)[:top_k], sorted(ops, key=size, reverse=True)[:top_k]


def profile_memory_step(
    function: Callable[..., object],
    *args: object,
    model: torch.nn.Module | None = None,
    top_k: int = 10,
    snapshot_path: str | os.PathLike[str] | None = None,
    **kwargs: object,
) -> MemoryProfileReport:
    """Run ``function(*args, **kwargs)`` once under the memory profiler and name the big allocators.

    Args:
        function: one training or inference step.
        *args: its positional arguments.
        model: when given, each submodule's forward is labelled so the report ranks modules too.
        top_k: how many modules and operators to keep.
        snapshot_path: on CUDA, also record allocator history and write a snapshot pickle here for
            https://pytorch.org/memory_viz (ignored without CUDA).
        **kwargs: its keyword arguments.

    Returns:
        A :class:`MemoryProfileReport`.

    Raises:
        ValueError: ``top_k`` is not positive.
    """
    if top_k < 1:
        raise ValueError(f"top_k must be at least 1, got {top_k}.")
    activities = [torch.profiler.ProfilerActivity.CPU]
    use_cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    if use_cuda:
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    record_history = use_cuda and snapshot_path is not None
    if record_history:
        # torch 2.13: torch/cuda/memory.py:892 (private; records allocator events for the memory snapshot)
        torch.cuda.memory._record_memory_history(max_entries=200_000)
    handles = _label_modules(model) if model is not None else []
    report = MemoryProfileReport()
    try:
        with torch.profiler.profile(activities=activities, profile_memory=True, record_shapes=True) as prof:
            report.result = function(*args, **kwargs)
            if use_cuda:
                torch.cuda.synchronize()
        if record_history and snapshot_path is not None:  # record_history implies a path
            path = report.snapshot_path = os.fspath(snapshot_path)
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            # torch 2.13: torch/cuda/memory.py:1129 (private; writes the snapshot pytorch.org/memory_viz reads)
            torch.cuda.memory._dump_snapshot(path)
    finally:
        for handle in handles:
            handle.remove()
        if record_history:
            # torch 2.13: torch/cuda/memory.py:892 (private; enabled=None stops the recording)
            torch.cuda.memory._record_memory_history(enabled=None)
    report.modules, report.ops = _rows(prof.key_averages(), top_k)
    logger.info("Memory profile of one step:\n" + report.table())
    return report
