"""The base class of the keyword-argument handlers (``KwargsHandler``), apart from the handlers themselves.

The Accelerator and ``TorchDynamoPlugin`` need only the base class; the concrete handlers in
:mod:`accelerando.plugins.kwargs` (five dataclasses) load when a script names one.
"""

from __future__ import annotations

import copy
from typing import Any

from accelerando.core.settings import environment_hidden

__all__ = ["KwargsHandler"]


class KwargsHandler:
    """Base class of the handlers: ``to_kwargs()`` returns the fields that differ from the defaults."""

    def to_dict(self) -> dict[str, Any]:
        """All fields as a dict (deep-copied)."""
        return copy.deepcopy(self.__dict__)

    def to_kwargs(self) -> dict[str, Any]:
        """Only the fields whose value differs from the default.

        The default is the handler built with no argument and no environment: a value a field took
        from an ``ACCELERATE_*`` variable (or a launcher's setting) counts as changed, like one given
        in code.
        """
        with environment_hidden():
            default = type(self)().to_dict()
        return {k: v for k, v in self.to_dict().items() if default.get(k) != v}
