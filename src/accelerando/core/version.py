"""The installed version of accelerando (one place; the package root re-exports it)."""

__all__ = ["__version__"]

__version__ = "0.1.0"
