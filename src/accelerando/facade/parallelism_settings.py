"""The parallelism layout an Accelerator uses when its script passed none."""

from __future__ import annotations

from typing import TYPE_CHECKING

from accelerando.core.settings import environment_setting

if TYPE_CHECKING:
    from accelerando.parallelism_config import ParallelismConfig

__all__ = ["default_parallelism_config"]


def default_parallelism_config(parallelism_config: ParallelismConfig | None) -> ParallelismConfig | None:
    """Return ``parallelism_config``, or one built from the launcher's settings when it is None.

    With the ``use_parallelism_config`` setting true (``ACCELERATE_USE_PARALLELISM_CONFIG``, written
    by ``launch --use_parallelism_config`` or any ``--parallelism_config_*`` flag) and no config given
    in code, a ``ParallelismConfig()`` is built; it reads its sizes and backends from the
    ``PARALLELISM_CONFIG_*`` variables. Otherwise None stays None (no mesh).

    Raises:
        ValueError: a ``PARALLELISM_CONFIG_*`` variable holds an invalid size or backend.
    """
    if parallelism_config is not None:
        return parallelism_config

    if not environment_setting("use_parallelism_config"):
        return None
    # Deferred: the ParallelismConfig dataclass loads only when the launcher asked for a mesh.
    from accelerando.parallelism_config import ParallelismConfig

    return ParallelismConfig()
