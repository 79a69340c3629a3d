"""One module per experiment-tracker backend; the public names live in :mod:`accelerando.tracking`.

Importing a backend module never imports its library: that happens in the tracker's ``start()``.
"""

from __future__ import annotations

__all__: list[str] = []
