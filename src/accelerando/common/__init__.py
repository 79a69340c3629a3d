"""Generic helpers every layer may use: tensor operations, availability checks, environment parsing,
random states, serialization, unwrapping, progress bars, constants.

This package sits in the low layers (below plugins and the capabilities, above state): nothing here
imports a strategy, a precision, the big-model code or the facade. The reference's
``accelerate.utils.*`` import paths re-export from here (:mod:`accelerando.utils`).
"""

from accelerando.core._lazy import lazy_getattr

__all__: list[str] = []

# Submodules are attributes on first access (``common.operations``), as after a regular import: the
# facade reaches the tensor operations and serialization this way, so a first ``Accelerator()``
# loads neither (tests/runtime/test_first_accelerator_modules.py).
__getattr__ = lazy_getattr(__name__, {}, globals(), submodules=True)
