"""Generic helpers every layer may use: tensor operations, availability checks, environment parsing,
random states, serialization, unwrapping, progress bars, constants.

This package sits in the low layers (below plugins and the capabilities, above state): nothing here
imports a strategy, a precision, the big-model code or the facade. The reference's
``accelerate.utils.*`` import paths re-export from here (:mod:`accelerando.utils`).
"""

__all__: list[str] = []
