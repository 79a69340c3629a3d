"""The skip decorators generated from accelerando.test_utils.testing's tables."""

from __future__ import annotations

import pytest

from accelerando.common import imports
from accelerando.test_utils import testing


def _test() -> None:
    """A test function to decorate."""


def test_every_library_decorator_has_its_availability_check():
    # require_<key> asks imports.is_<key>_available; a typo in a key would silently fall back to modules.
    missing = [key for key in testing._LIBRARIES if not hasattr(imports, f"is_{key}_available")]
    assert missing == []


@pytest.mark.parametrize("key", sorted(testing._LIBRARIES))
def test_library_decorator_follows_its_check(monkeypatch, key):
    decorator = getattr(testing, f"require_{key}")
    monkeypatch.setattr(imports, f"is_{key}_available", lambda: False)
    decorated = decorator(_test)
    assert decorated.__unittest_skip__ is True
    assert decorated.__unittest_skip_why__.startswith("test requires ")
    monkeypatch.setattr(imports, f"is_{key}_available", lambda: True)
    assert not getattr(decorator(_test), "__unittest_skip__", False)


def test_every_generated_decorator_is_public():
    for name in testing._CONDITIONS:
        assert name in testing.__all__
        assert getattr(testing, name).__name__ == name
