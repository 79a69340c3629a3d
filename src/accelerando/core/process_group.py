"""The default ``torch.distributed`` process group: its start and its ordered teardown.

Contract (who calls what, in which order, what holds afterwards):

1. Once per process, the owner of the process state (today ``PartialState``, later the Runtime)
   calls :func:`start` with what the cluster environment and the device family decided. Afterwards
   the default process group is initialised, and an exit hook is registered (once per process).
   The returned :class:`ProcessGroupHandle` is the only object that ends the group's life.
2. Anyone may call :meth:`ProcessGroupHandle.shutdown` before exit (``PartialState().
   destroy_process_group()`` does). It is collective in spirit: every process calls it, they agree,
   then each destroys its group. Afterwards ``torch.distributed.is_initialized()`` is False. A
   second call, or a call after the user destroyed the group with ``torch.distributed.
   destroy_process_group()``, is harmless.
3. At interpreter exit the hook calls ``shutdown()`` when no one did. When the process is exiting
   because of an uncaught exception, or a ``SystemExit`` with a failing status (``sys.exit(3)``,
   seen by the ``sys.exit`` :func:`start` wraps, and any ``SystemExit`` out of a script that
   ``accelerando launch``'s process shim runs, which calls :func:`mark_failed`: Python runs no hook
   of its own for a ``SystemExit``), it does not wait for the others: it tells them (so a process
   already waiting stops waiting) and only destroys its own group. A peer waiting in a collective for it could never
   reach the teardown, so waiting for it would only delay the job's end by the whole shutdown
   timeout (30 s), and every restart of ``--max_restarts`` would pay it again.

The agreement runs on the rendezvous store (a ``TCPStore``), not on the process group itself:
see :meth:`ProcessGroupHandle.shutdown` for why. The teardown exists because a gloo backend still
alive when the interpreter finalizes can abort a finished process (exit 134): see :func:`start`.
"""

from __future__ import annotations

import atexit
import functools
import os
import sys
import threading
import time
from datetime import timedelta
from types import TracebackType
from typing import TYPE_CHECKING, NoReturn

from accelerando.core.listeners import listen_address, store_server

if TYPE_CHECKING:
    from collections.abc import Callable

    import torch
    from torch.distributed.distributed_c10d import Store

__all__ = ["CPU_BACKENDS", "DEFAULT_SHUTDOWN_TIMEOUT_S", "ProcessGroupHandle", "mark_failed", "start"]

#: process-group backends that can run collectives on CPU tensors.
CPU_BACKENDS = ("gloo", "mpi", "ccl", "cpu:gloo,cuda:nccl")
#: seconds a process waits at exit for the others before destroying its group anyway.
DEFAULT_SHUTDOWN_TIMEOUT_S = 30.0

# Keys of the teardown, under a prefix of their own per group this process started (see start()).
_ARRIVED = "arrived"  # counter: processes that reached the teardown
_RELEASE = "release"  # "ok" when all arrived, "abort:<rank>" when one failed
_DESTROYED = "destroyed"  # counter: processes whose group is destroyed
_DESTROYED_ALL = "destroyed_all"
_QUIESCE_S = 0.05  # pause for gloo workers still alive after the teardown (see _destroy_default_group)
_FAILED_DESTROY_S = 5.0  # a failing process frees its group for at most this long, then exits


class ProcessGroupHandle:
    """The live default process group of this process, and the one way to end it.

    Created by :func:`start`; hold it for the life of the process (the Runtime does).

    Attributes:
        backend: the backend torch reports for the default group (``"gloo"``, ``"nccl"``, ...).
        rank: this process's global rank.
        world_size: the number of processes in the group.
        shutdown_timeout_s: the default bound of :meth:`shutdown`'s wait for the other processes.
    """

    def __init__(
        self, backend: str, rank: int, world_size: int, store: Store | None, shutdown_timeout_s: float
    ) -> None:
        self.backend = backend
        self.rank = rank
        self.world_size = world_size
        self.shutdown_timeout_s = shutdown_timeout_s
        self._store = store
        self._lock = threading.Lock()
        self._done = False
        self._failed = False

    @property
    def is_shut_down(self) -> bool:
        """True once :meth:`shutdown` has run (the default group is destroyed)."""
        return self._done

    def mark_failed(self) -> None:
        """Record that this process is exiting because of an error: teardown will not wait for peers.

        Called by the exception hook :func:`start` installs; callers that catch a fatal error
        themselves and exit may call it too.
        """
        self._failed = True

    def shutdown(self, timeout_s: float | None = None) -> bool:
        """Agree with the other processes, then destroy the default process group. Idempotent.

        Order: (1) each process counts itself in on the store and waits until all have, or one
        reported a failure, or ``timeout_s`` passed; (2) it collects garbage and destroys its default
        group, so that the backend is freed and its worker threads are joined now, while the
        interpreter is whole (bounded by ``timeout_s``, 5 s in a failing process); (3) it counts itself
        out, and after an agreement rank 0 waits (same bound) until all are out. Step 1 ensures no
        process closes its connections while a peer may still be in a collective or reading from them
        and that every collective has completed, so that step 2 finds the worker threads idle;
        step 3 keeps rank 0, which hosts the store when no launcher agent does, alive until every
        process is done with the store.

        Why the store and not ``barrier()`` / ``monitored_barrier()``: a gloo barrier cannot be bounded
        per call (it uses the group's timeout, 30 minutes by default), it runs on the very connections
        being torn down, and a dead peer makes it raise from inside gloo. The store has a per-call
        timeout, stays usable after the group is destroyed, and lets a failing process release the
        others at once.

        Args:
            timeout_s: seconds to wait for the others at each waiting step; defaults to the handle's
                ``shutdown_timeout_s``. When it passes the group is destroyed anyway.

        Returns:
            True when every process agreed in time (or there was nothing to agree on, or the handle
            was already shut down), False when the wait timed out, a peer failed, or the store was
            unreachable.
        """
        with self._lock:
            if self._done:
                return True
            self._done = True
            bound = self.shutdown_timeout_s if timeout_s is None else timeout_s
            agreed = self._agree(bound)
            _destroy_default_group(min(bound, _FAILED_DESTROY_S) if self._failed else bound)
            self._count_out(bound, wait=agreed)
            self._store = None
            return agreed

    # ----------------------------------------------------------------- steps
    def _agree(self, bound: float) -> bool:
        if self._store is None or self.world_size <= 1:
            return True
        try:
            if self._failed:
                self._store.set(_RELEASE, f"abort:{self.rank}")
                return False
            if self._store.add(_ARRIVED, 1) >= self.world_size:
                self._store.set(_RELEASE, "ok")
            self._store.wait([_RELEASE], timedelta(seconds=bound))
            return self._store.get(_RELEASE) == b"ok"
        except Exception:  # noqa: BLE001 - a timeout or an unreachable store: destroy anyway
            return False

    def _count_out(self, bound: float, wait: bool) -> None:
        # Only after an agreement does rank 0 wait: a peer that vanished or failed may never count out,
        # and a failing process must exit at once so that the launcher sees it.
        if self._store is None or self.world_size <= 1:
            return
        try:
            if self._store.add(_DESTROYED, 1) >= self.world_size:
                self._store.set(_DESTROYED_ALL, "ok")
            if wait and self.rank == 0:
                self._store.wait([_DESTROYED_ALL], timedelta(seconds=bound))
        except Exception:  # noqa: BLE001 - exiting anyway; never mask the real exit status
            pass


def _destroy_default_group(bound: float) -> None:
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    # Freeing the backend joins its worker threads, which waits for a collective still in flight; one
    # that never completes (a peer died, an async op never matched) must not hang the exit.
    freeing = threading.Thread(target=_free_default_group, name="accelerando-pg-teardown", daemon=True)
    freeing.start()
    freeing.join(bound)
    if not freeing.is_alive() and _gloo_workers_alive():
        # Something the user still holds keeps the backend (and its threads) alive into interpreter
        # finalization. A pause without the GIL lets a worker finish releasing its last work now,
        # while entering Python is still allowed.
        time.sleep(_QUIESCE_S)


def _free_default_group() -> None:
    import gc

    import torch.distributed as dist

    try:
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - exiting anyway; never mask the real exit status
        return
    if _gloo_workers_alive():
        # Cyclic garbage (an Accelerator left by a finished main(), holding DDP and its reducer) still
        # holds the backend; collected now, the backend is freed and its worker threads are joined
        # while the interpreter is whole (see start()). Only then: a full collection costs 0.1-0.4 s.
        gc.collect()


def _gloo_workers_alive() -> bool:
    # Linux names gloo's worker threads; elsewhere there is nothing to read and no pause is taken.
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return False
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/comm", encoding="ascii", errors="replace") as comm:
                if comm.read().startswith("pt_gloo_runloop"):
                    return True
        except OSError:
            continue
    return False


def start(
    *,
    device: torch.device,
    default_backend: str | None,
    main_address: str,
    main_port: int,
    rank: int,
    world_size: int,
    backend: str | None = None,
    timeout: timedelta | None = None,
    shutdown_timeout_s: float = DEFAULT_SHUTDOWN_TIMEOUT_S,
    init_method: str | None = None,
    attempt: int = 0,
    bind_address: str | None = None,
) -> ProcessGroupHandle:
    """Initialise the default process group and register its ordered teardown at exit.

    Args:
        device: this process's ``torch.device``; decides whether the backend must run on CPU and is
            the nccl ``device_id``.
        default_backend: the device family's backend, used when ``backend`` is None.
        main_address: host of the rendezvous store (the cluster environment's ``main_address``).
        main_port: its port.
        rank: this process's global rank.
        world_size: the number of processes.
        backend: an explicit backend (``InitProcessGroupKwargs(backend=...)``).
        timeout: the group's collective timeout; torch's default when None.
        shutdown_timeout_s: the bound of the exit-time wait for the other processes.
        init_method: a rendezvous URL used instead of ``tcp://main_address:main_port`` (e.g.
            ``file:///tmp/rdv`` from ``ACCELERATE_DEBUG_RDV_FILE``).
        attempt: the elastic agent's restart count (the cluster environment's ``restart_count``).
            Every key this group and its teardown write is prefixed with it: the agent's store
            outlives a restart, and a try that read the previous try's gloo addresses would connect
            to processes that are gone ("connectFullMesh ... Connection refused").
        bind_address: where rank 0 hosts the store when no launcher agent hosts it (``--bind_address``);
            ``main_address`` when None. Never every interface unless it says so
            (:mod:`accelerando.core.listeners`).

    Returns:
        The handle that ends the group's life. When a default group already exists (a user
        initialised it), it is adopted, and the teardown agreement is skipped (there is no store).

    Raises:
        ValueError: the backend cannot run on this device (e.g. nccl on CPU), or none is known.
        RuntimeError: the rendezvous with the other processes failed (from torch.distributed).
    """
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import PrefixStore

    chosen = backend or default_backend
    if chosen is None:
        raise ValueError("no process-group backend is known for this device; pass backend='gloo' or 'nccl'")
    if getattr(device, "type", "cpu") == "cpu" and chosen not in CPU_BACKENDS:
        raise ValueError(
            f"process-group backend {chosen!r} cannot run on CPU; use backend='gloo' "
            "(InitProcessGroupKwargs(backend='gloo')) or run on GPUs"
        )
    if dist.is_initialized() and _current is not None and not _current.is_shut_down:
        # The process state was reset (tests) but the group lives on: keep the handle that owns it.
        return _current
    store: Store | None = None
    if not dist.is_initialized():
        # Imported before the group exists, on purpose. This module binds ``group=group.WORLD`` as default
        # arguments when imported; imported later (DistributedDataParallel imports it through
        # torch._dynamo) it pins the default group forever, destroy_process_group() can then no longer
        # free the gloo backend, and its worker threads live on into interpreter finalization. A worker
        # that then releases a Python-owned tensor (the outputs of a last all_gather) or runs a Python
        # callback takes the GIL; CPython ends such a thread with pthread_exit during finalization, the
        # unwind crosses a noexcept C++ frame, and std::terminate aborts the process ("terminate called
        # without an active exception", exit 134) after training has finished.
        import torch.distributed.nn.functional  # noqa: F401

        store_timeout = timeout if timeout is not None else _default_timeout(chosen)
        # The store is made here, not inside init_process_group, so that the teardown can agree on
        # it after the group is gone; rendezvous() picks the launcher agent's store when there is one.
        where = (main_address, main_port, bind_address)
        store, rank, world_size = _rendezvous(init_method, where, rank, world_size, store_timeout)
        store.set_timeout(store_timeout)
        # torch's own env:// rendezvous does the same under an agent store; tcp:// and file:// do not.
        store = PrefixStore(f"accelerando/attempt_{attempt}", store)
        dist.init_process_group(
            backend=chosen,
            store=PrefixStore("default_pg", store),
            rank=rank,
            world_size=world_size,
            timeout=timeout,  # None: torch's default for the backend
            device_id=device if chosen == "nccl" else None,
        )
    global _started
    if store is not None:
        # Every process starts its groups in the same order, so the count names the same group
        # everywhere; a second group on the same store (tests) must not see the first one's keys.
        _started += 1
        store = PrefixStore(f"accelerando/shutdown/{_started}", store)
    handle = ProcessGroupHandle(str(dist.get_backend()), rank, world_size, store, shutdown_timeout_s)
    _register(handle)
    return handle


def _rendezvous(
    init_method: str | None,
    where: tuple[str, int, str | None],
    rank: int,
    world_size: int,
    timeout: timedelta,
) -> tuple[Store, int, int]:
    """The rendezvous store, this process's rank and the world size (torch's ``rendezvous``, bound).

    torch's ``tcp://`` rendezvous hosts rank 0's store on every interface; when no launcher agent
    hosts the store (a Ray launch, a process started by hand), rank 0 hosts it on the bind address
    only (``where``: the main address, its port and the bind address). A job of one process that no
    agent hosts keeps its store in memory: no port is opened.
    """
    # torch 2.13: torch/distributed/rendezvous.py:158 (private; does torchelastic's agent host the store?)
    from torch.distributed.rendezvous import _torchelastic_use_agent_store, rendezvous

    main_address, main_port, bind_address = where
    agent_store = _torchelastic_use_agent_store()
    if init_method is None and world_size == 1 and not agent_store:  # one process (FSDP on one device)
        # torch 2.13: torch/_C/_distributed_c10d.pyi:233 (documented as torch.distributed.HashStore)
        from torch._C._distributed_c10d import HashStore

        return HashStore(), 0, 1
    if init_method is None and rank == 0 and not agent_store:
        bind = listen_address(bind_address, main_address)
        store = store_server(
            bind, main_port, world_size=world_size, timeout=timeout, wait_for_workers=True, multi_tenant=True
        )
        return store, rank, world_size
    url = init_method or f"tcp://{main_address}:{main_port}"
    return next(rendezvous(url, rank, world_size, timeout=timeout))


def _default_timeout(backend: str) -> timedelta:
    # What init_process_group itself would use when given no timeout (nccl has its own default).
    from torch.distributed import constants

    nccl = getattr(constants, "default_pg_nccl_timeout", None)
    return nccl if backend == "nccl" and nccl is not None else constants.default_pg_timeout


# One hook per process, pointing at the newest handle: a test that starts again after a shutdown
# must not stack hooks, and only the live group needs a teardown.
_current: ProcessGroupHandle | None = None
_hooks_installed = False
_started = 0


def _register(handle: ProcessGroupHandle) -> None:
    global _current, _hooks_installed
    _current = handle
    if _hooks_installed:
        return
    _hooks_installed = True
    previous = sys.excepthook

    def _excepthook(kind: type[BaseException], value: BaseException, traceback: TracebackType | None) -> None:
        if _current is not None:
            _current.mark_failed()
        previous(kind, value, traceback)

    sys.excepthook = _excepthook
    sys.exit = _exit_marking_failure(sys.exit)
    atexit.register(_shutdown_at_exit)


def _exit_marking_failure(original: Callable[..., NoReturn]) -> Callable[..., NoReturn]:
    """``sys.exit`` that first calls :func:`mark_failed` when its status is a failure.

    Python runs no hook for a ``SystemExit``, so without this a process started by another launcher
    (torchrun, plain ``python``) that calls ``sys.exit(3)`` while a peer waits for it in a collective
    would wait the whole shutdown timeout at exit (``accelerando launch``'s shim also catches a
    ``raise SystemExit(3)``). Only the main thread's call counts: elsewhere it ends one thread.
    """

    @functools.wraps(original)
    def exit(status: object = None, /) -> NoReturn:  # noqa: A001 - it stands for sys.exit
        if _is_failing(status) and threading.current_thread() is threading.main_thread():
            mark_failed()
        original(status)

    return exit


def _is_failing(status: object) -> bool:
    """Whether ``SystemExit(status)`` ends the process with a non-zero exit status."""
    return status is not None and (not isinstance(status, int) or status != 0)


def mark_failed() -> None:
    """Record that this process is ending with a failure: its exit-time teardown will not wait for peers.

    For an exit Python's exception hook never sees: a ``SystemExit`` with a non-zero status
    (``sys.exit(3)``, argparse's error exit). ``accelerando launch``'s process shim
    (:mod:`accelerando.launchers._child`) calls it when the script raises one; code that ends its
    process with a failing status by other means may call it first. Does nothing when no process
    group was started.
    """
    if _current is not None:
        _current.mark_failed()


def _shutdown_at_exit() -> None:
    if _current is not None:
        try:
            _current.shutdown()
        except BaseException:  # noqa: BLE001 - never mask the real exit status
            pass
