"""``accelerando launch --ray [ADDRESS]``: run an unchanged script's processes as actors of a Ray cluster.

:func:`run_on_ray` is the driver (:mod:`.driver`); each process runs inside a
:class:`~accelerando.launchers.ray.worker.RankProcess` actor (:mod:`.worker`). Ray is imported only
when a ``--ray`` launch runs (install it with the ``ray`` extra: ``pip install "accelerando[ray]"``).
"""

from __future__ import annotations

from accelerando.launchers.ray.driver import (
    Failure,
    check_ray_settings,
    failure_summary,
    process_env,
    rank_by_machine,
    run_on_ray,
)

__all__ = ["Failure", "check_ray_settings", "failure_summary", "process_env", "rank_by_machine", "run_on_ray"]
