"""Old private path of :func:`~accelerando.big_modeling.budgets.convert_file_size_to_int`.

Kept only because ``accelerando/model_io.py`` still imports it from here; once that file imports
``accelerando.big_modeling.budgets`` instead, delete this module.
"""

from __future__ import annotations

from accelerando.big_modeling.budgets import convert_file_size_to_int

__all__ = ["convert_file_size_to_int"]
