"""A plain ``python script.py``: one process, no rendezvous."""

from __future__ import annotations

from collections.abc import Mapping

from typing_extensions import override

from accelerando.core.environments.base import ClusterEnvironment

__all__ = ["SingleProcessEnvironment"]


class SingleProcessEnvironment(ClusterEnvironment):
    """World size 1, rank 0. Always detected; it is the fallback."""

    name = "single"

    @override
    @classmethod
    def detect(cls, environ: Mapping[str, str]) -> bool:
        return True

    @property
    @override
    def world_size(self) -> int:
        return 1

    @property
    @override
    def rank(self) -> int:
        return 0

    @property
    @override
    def local_rank(self) -> int:
        return 0
