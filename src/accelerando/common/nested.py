"""Type aliases for the nested structures the tensor helpers walk (annotations only).

A batch, a model output or a gathered result is a leaf (usually a tensor) or any nesting of lists,
tuples (named ones too) and ``str``-keyed mappings of such values; :mod:`accelerando.common.operations`
walks these and rebuilds each container with its own type. Import the names under
``if TYPE_CHECKING:``: they exist for the type checker, nothing reads them at run time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, TypeAlias, TypeVar

if TYPE_CHECKING:
    import torch

__all__ = ["Nested", "TensorTree"]

Leaf = TypeVar("Leaf")

# A leaf of type ``Leaf``, or lists / tuples / mappings (keyed by name) nesting such leaves.
Nested: TypeAlias = "Leaf | Sequence[Nested[Leaf]] | Mapping[str, Nested[Leaf]]"

# A tensor or a nesting of lists, tuples and mappings of tensors.
TensorTree: TypeAlias = "Nested[torch.Tensor]"
