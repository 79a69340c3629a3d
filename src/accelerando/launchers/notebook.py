"""Run a function in several processes from a notebook, a REPL or a test.

Both launchers hand the function to PyTorch's elastic agent (``torch.distributed.launcher``), which
starts the processes, sets ``RANK`` / ``WORLD_SIZE`` / ``LOCAL_RANK`` / ``MASTER_ADDR`` /
``MASTER_PORT`` in each, and collects results and failures. Processes are forked so that a function
defined in a notebook cell (which cannot be pickled by reference) runs as is; forking after CUDA was
initialised is unsafe, so that case is refused with the fix. Settings reach the processes through
``ACCELERANDO_*`` environment variables set only for the duration of the launch.
"""

from __future__ import annotations

import logging
import socket
import sys
import uuid
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, TypedDict

from accelerando.common.environment import patch_environment
from accelerando.core.listeners import LOOPBACK, is_loopback
from accelerando.core.runtime import current_process
from accelerando.core.settings.machine import detect_machine, free_port, visible_gpu_count
from accelerando.core.settings.resolve import parse_value
from accelerando.launchers.bound_rendezvous import bound_rendezvous
from accelerando.launchers.plan import loopback_sockets
from accelerando.state import PartialState

if TYPE_CHECKING:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from typing_extensions import Unpack


class _Rendezvous(TypedDict):
    rdzv_endpoint: str


class _AgentOptions(_Rendezvous, total=False):
    """The elastic agent's options :func:`_launch` reads (all but the endpoint have defaults)."""

    num_nodes: int
    node_rank: int
    rdzv_id: str
    rdzv_backend: str
    rdzv_conf: dict[str, object] | None
    max_restarts: int
    monitor_interval: float
    log_line_prefix_template: str | None


__all__ = [
    "ELASTIC_LOG_LINE_PREFIX_TEMPLATE_PYTORCH_VERSION",
    "notebook_launcher",
    "debug_launcher",
    "test_launch",
]

#: First PyTorch version whose elastic agent takes ``log_line_prefix_template``.
ELASTIC_LOG_LINE_PREFIX_TEMPLATE_PYTORCH_VERSION = "2.2.0"


class LaunchedFunctionError(RuntimeError):
    """A process started by :func:`notebook_launcher` or :func:`debug_launcher` failed."""


def _port_is_free(port: int, address: str) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((address if address not in ("localhost",) else "127.0.0.1", port))
        except OSError:
            return False
    return True


def _check_parent_is_clean() -> None:
    import torch

    if current_process() is not None:
        raise ValueError(
            "An Accelerator or PartialState already exists in this process, so its state would be copied "
            "into every launched process. Fix: create the Accelerator inside the launched function only, "
            "and restart the notebook kernel."
        )
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        raise ValueError(
            "CUDA was initialised in this process before launching, and forked processes cannot use it. "
            "Fix: move every CUDA call (models, tensors moved to 'cuda', torch.cuda.*) into the launched "
            "function, then restart the notebook kernel."
        )


def _format_failure(err: ChildFailedError) -> str:
    rank, failure = err.get_first_failure()
    data = failure.error_file_data.get("message", {}) if isinstance(failure.error_file_data, dict) else {}
    trace = data.get("extraInfo", {}).get("py_callstack") if isinstance(data, dict) else None
    body = trace or failure.message
    return f"Process {rank} of the launched function failed (exit code {failure.exitcode}):\n{body}"


def _named(function: Callable[..., object]) -> Callable[..., object]:
    """Return a plain function calling ``function``, named after it (or its type) for the agent."""
    target = getattr(function, "func", function)  # functools.partial keeps the real one in .func

    def run(*args: object) -> object:
        return function(*args)

    run.__name__ = getattr(target, "__name__", type(target).__name__)
    run.__qualname__ = run.__name__
    return run


def _launch(
    function: Callable[..., object],
    args: tuple[object, ...],
    nprocs: int,
    env: Mapping[str, str],
    **kw: Unpack[_AgentOptions],
) -> list[object]:
    """Start ``nprocs`` forked processes through the elastic agent and return their results by rank.

    The agent names its processes after ``function.__name__``, which a ``functools.partial`` or a
    callable object lacks; such a function is run through a named wrapper (forked, so never pickled).
    """
    if not hasattr(function, "__name__"):
        function = _named(function)
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    config = LaunchConfig(min_nodes=kw.get("num_nodes", 1), max_nodes=kw.get("num_nodes", 1), nproc_per_node=nprocs,
                          run_id=kw.get("rdzv_id") or str(uuid.uuid4()), rdzv_endpoint=kw["rdzv_endpoint"],
                          rdzv_backend=kw.get("rdzv_backend", "static"), rdzv_configs=kw.get("rdzv_conf") or {},
                          max_restarts=kw.get("max_restarts", 0), monitor_interval=kw.get("monitor_interval", 0.1),
                          start_method="fork", log_line_prefix_template=kw.get("log_line_prefix_template"))  # fmt: skip
    if config.rdzv_backend == "static":
        config.rdzv_configs.setdefault("rank", kw.get("node_rank", 0))
    # The rendezvous stores listen on the endpoint's host only (loopback on one machine); on one machine
    # the workers' store (c10d) is advertised there too, and gloo/NCCL sockets use the loopback interface.
    bind = kw["rdzv_endpoint"].rsplit(":", 1)[0].strip("[]") or LOOPBACK
    if kw.get("num_nodes", 1) == 1 and is_loopback(bind):
        config.local_addr = bind
        env = {**loopback_sockets(detect_machine()), **env}
    # The agent logs each failure's traceback again; the parent raises it once, below.
    agent_logger = logging.getLogger("torch.distributed.elastic")
    level = agent_logger.level
    agent_logger.setLevel(logging.CRITICAL)
    with patch_environment(**env), bound_rendezvous(bind):
        try:
            results = elastic_launch(config, function)(*args)
        except ChildFailedError as err:
            raise LaunchedFunctionError(_format_failure(err)) from None
        finally:
            agent_logger.setLevel(level)
    return [results[rank] for rank in sorted(results)] if isinstance(results, dict) else [results]


def notebook_launcher(
    function: Callable[..., object],
    args: tuple[object, ...] = (),
    num_processes: int | None = None,
    mixed_precision: str = "no",
    use_port: str | int = "29500",
    master_addr: str = "127.0.0.1",
    node_rank: int = 0,
    num_nodes: int = 1,
    rdzv_backend: str = "static",
    rdzv_endpoint: str = "",
    rdzv_conf: dict[str, object] | None = None,
    rdzv_id: str = "none",
    max_restarts: int = 0,
    monitor_interval: float = 0.1,
    log_line_prefix_template: str | None = None,
) -> object:
    """Run ``function(*args)`` in ``num_processes`` processes on this machine and wait for them.

    Call it from a notebook cell or a REPL; create the Accelerator *inside* ``function``.

    Args:
        function: the training function; it may be defined in the notebook itself.
        args: positional arguments passed to ``function`` in every process.
        num_processes: processes to start on this machine; ``None`` = one per visible GPU, or 1.
        mixed_precision: ``"no"``, ``"fp16"``, ``"bf16"`` or ``"fp8"``, passed to each process.
        use_port: port of the rendezvous on ``master_addr``; on one machine a busy port is replaced by
            a free one.
        master_addr: address of the machine of node rank 0.
        node_rank: rank of this machine.
        num_nodes: number of machines.
        rdzv_backend: rendezvous backend (``"static"``, ``"c10d"``, ...).
        rdzv_endpoint: rendezvous ``host:port`` (default ``master_addr:use_port``).
        rdzv_conf: extra rendezvous settings.
        rdzv_id: job id shared by all machines of a non-static rendezvous.
        max_restarts: restarts allowed before failing.
        monitor_interval: seconds between checks of the processes.
        log_line_prefix_template: prefix for each output line, e.g. ``"[${rank}]"``.

    Returns:
        With one process, ``function``'s return value (run in this process); otherwise the list of
        each process's return value, by rank.

    Raises:
        ValueError: bad arguments, an Accelerator created before launching, or CUDA initialised in
            this process (the message says how to fix it).
        LaunchedFunctionError: a process failed; the message holds its traceback.

    Example:
        >>> from accelerando import Accelerator, notebook_launcher
        >>> def training_function(learning_rate):
        ...     accelerator = Accelerator()  # created inside the function, in every process
        ...     accelerator.print(f"{accelerator.num_processes} processes, learning rate {learning_rate}")
        >>> notebook_launcher(training_function, args=(1e-3,), num_processes=2)  # doctest: +SKIP
        2 processes, learning rate 0.001
    """
    precision = parse_value("mixed_precision", mixed_precision, "notebook_launcher(mixed_precision=...)")
    if log_line_prefix_template is not None:
        _check_prefix_template_support()
    if num_processes is None:
        num_processes = max(1, visible_gpu_count())
    if not isinstance(num_processes, int) or num_processes < 1:
        raise ValueError(f"num_processes={num_processes!r} must be a positive integer. Fix: pass e.g. 2.")
    env = {"ACCELERANDO_MIXED_PRECISION": precision, "ACCELERATE_MIXED_PRECISION": precision}
    if num_processes == 1 and num_nodes == 1:
        with patch_environment(**env):
            return function(*args)
    _check_parent_is_clean()
    port = int(use_port)
    if num_nodes == 1 and not rdzv_endpoint and not _port_is_free(port, master_addr):
        port = free_port()
        print(f"notebook_launcher: port {use_port} is busy; using {port}.", file=sys.stderr)
    endpoint = rdzv_endpoint or f"{master_addr}:{port}"
    machine = detect_machine()
    if not machine.omp_threads_set:  # share the cores instead of one thread per core in every process
        env["OMP_NUM_THREADS"] = str(max(1, machine.cpu_count // num_processes))
    return _launch(function, tuple(args), num_processes, env, num_nodes=num_nodes, node_rank=node_rank,
                   rdzv_endpoint=endpoint, rdzv_backend=rdzv_backend, rdzv_conf=rdzv_conf,
                   rdzv_id=rdzv_id, max_restarts=max_restarts, monitor_interval=monitor_interval,
                   log_line_prefix_template=log_line_prefix_template)  # fmt: skip


def _check_prefix_template_support() -> None:
    import torch
    from packaging.version import Version

    if Version(torch.__version__.split("+")[0]) < Version(ELASTIC_LOG_LINE_PREFIX_TEMPLATE_PYTORCH_VERSION):
        raise ValueError(
            f"log_line_prefix_template needs torch >= {ELASTIC_LOG_LINE_PREFIX_TEMPLATE_PYTORCH_VERSION}; this is "
            f"torch {torch.__version__}. Fix: upgrade torch or drop log_line_prefix_template."
        )


def test_launch() -> None:
    """Check that this process can set up accelerando's process state (what a launched script does first).

    Raises:
        RuntimeError: the process group cannot be set up (from torch.distributed), or another error
            of the environment the launcher gave this process.
    """
    PartialState()


def debug_launcher(
    function: Callable[..., object], args: tuple[object, ...] = (), num_processes: int = 2
) -> list[object]:
    """Run ``function(*args)`` in ``num_processes`` CPU processes, for tests and debugging.

    Args:
        function: the function to run in each process.
        args: positional arguments passed to it.
        num_processes: processes to start (at least 1).

    Returns:
        The list of each process's return value, by rank.

    Raises:
        ValueError: for a bad ``num_processes`` or an Accelerator created before launching.
        LaunchedFunctionError: a process failed; the message holds its traceback.

    Example:
        >>> from accelerando import PartialState, debug_launcher
        >>> def rank():
        ...     return PartialState().process_index
        >>> debug_launcher(rank, num_processes=2)  # doctest: +SKIP
        [0, 1]
    """
    if not isinstance(num_processes, int) or num_processes < 1:
        raise ValueError(f"num_processes={num_processes!r} must be a positive integer. Fix: pass e.g. 2.")

    if current_process() is not None:
        raise ValueError(
            "A PartialState already exists in this process. Fix: create the Accelerator inside the function."
        )
    env = {"ACCELERANDO_USE_CPU": "true", "OMP_NUM_THREADS": "1"}
    return _launch(function, tuple(args), num_processes, env, rdzv_endpoint=f"127.0.0.1:{free_port()}")
