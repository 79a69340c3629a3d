"""``accelerando.core.records``: dataclass behaviour for the library's internal records, without generated code.

Each record is checked against the dataclass declared the same way: what ``__init__`` accepts and
refuses, the values it stores (fresh factory values per instance), ``repr``, ``==``, ``hash``, frozen
assignment, init-only arguments and ``replace``. The counted test asserts what the module is for:
building a record class compiles and executes no source text.
"""

from __future__ import annotations

import builtins
import dataclasses
from dataclasses import InitVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from accelerando.core import records
from accelerando.core.records import entry, field_names, record


@record
class Point:
    x: int
    y: int = 0
    tags: list[str] = entry(default_factory=list)


@dataclasses.dataclass(frozen=True)
class PointDataclass:
    x: int
    y: int = 0
    tags: list[str] = dataclasses.field(default_factory=list)


@record(frozen=False)
class Counter:
    start: InitVar[int]
    label: str = "c"
    value: int = entry(init=False, compare=False)

    def __post_init__(self, start: int) -> None:
        self.value = start * 2


def _outcome(cls: type, args: tuple[object, ...], kwargs: dict[str, object]) -> tuple[str, object]:
    try:
        made = cls(*args, **kwargs)
    except TypeError:
        return ("TypeError", None)
    return ("ok", (made.x, made.y, made.tags))


ARGUMENT = st.one_of(st.integers(-3, 3), st.lists(st.sampled_from("ab"), max_size=2))
KEYWORDS = st.dictionaries(st.sampled_from(["x", "y", "tags", "z"]), ARGUMENT, max_size=3)


@settings(max_examples=300, deadline=None)
@given(args=st.lists(ARGUMENT, max_size=4).map(tuple), kwargs=KEYWORDS)
def test_init_accepts_and_refuses_what_the_dataclass_does(
    args: tuple[object, ...], kwargs: dict[str, object]
):
    assert _outcome(Point, args, kwargs) == _outcome(PointDataclass, args, kwargs)


@settings(max_examples=200, deadline=None)
@given(x=st.integers(), y=st.integers(), other_x=st.integers())
def test_eq_hash_and_repr_match_the_dataclass(x: int, y: int, other_x: int):
    mine, theirs = Point(x, y), PointDataclass(x, y)
    assert repr(mine).replace("Point", "PointDataclass", 1) == repr(theirs)
    assert (mine == Point(other_x, y)) == (theirs == PointDataclass(other_x, y))
    assert mine != theirs  # another class is never equal, as between two dataclasses
    assert (hash(Point(x, y, ())) == hash(Point(x, y, ()))) is True  # type: ignore[arg-type]


def test_factories_give_each_instance_its_own_value():
    first, second = Point(1), Point(2)
    first.tags.append("a")
    assert second.tags == [] and Point.__dict__.get("tags", None) is None


def test_frozen_records_refuse_assignment_and_deletion_like_a_frozen_dataclass():
    point = Point(1)
    with pytest.raises(dataclasses.FrozenInstanceError, match="'x'"):
        point.x = 2  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        del point.y  # type: ignore[misc]
    mutable = Counter(3)
    mutable.label = "d"
    assert mutable.label == "d"
    with pytest.raises(TypeError, match="unhashable"):
        hash(mutable)


def test_init_only_arguments_reach_post_init_and_are_not_stored():
    counter = Counter(4, label="n")
    assert counter.value == 8 and not hasattr(counter, "start")
    assert counter == Counter(5, label="n")  # value is compare=False
    assert repr(counter) == "Counter(label='n', value=8)"


def test_replace_builds_a_new_record_through_init():
    point = Point(1, 2, ["t"])
    assert records.replace(point, y=5) == Point(1, 5, ["t"])
    assert records.replace(Counter(1), start=7).value == 14
    with pytest.raises(ValueError, match="'start'"):
        records.replace(Counter(1))
    with pytest.raises(ValueError, match="'value'"):
        records.replace(Counter(1), start=1, value=3)
    with pytest.raises(TypeError, match="record"):
        records.replace(PointDataclass(1), x=2)
    assert field_names(point) == ("x", "y", "tags") and field_names(Counter) == ("label", "value")


def test_a_required_field_after_a_default_is_refused_when_the_class_is_built():
    with pytest.raises(TypeError, match="'b' without a default"):

        @record
        class Broken:
            a: int = 1
            b: int  # type: ignore[misc]

    @record
    class Allowed:  # as with dataclasses, only __init__'s own arguments are ordered
        a: int = entry(default=1, init=False)
        b: int

    assert Allowed(b=2).a == 1

    with pytest.raises(ValueError, match="not both"):
        entry(default=1, default_factory=list)


def test_building_a_record_class_compiles_and_executes_no_source(monkeypatch: pytest.MonkeyPatch):
    calls: list[str] = []
    real_exec, real_compile = builtins.exec, builtins.compile

    def counting_exec(*args: object, **kwargs: object) -> object:
        calls.append("exec")
        return real_exec(*args, **kwargs)  # type: ignore[arg-type]

    def counting_compile(*args: object, **kwargs: object) -> object:
        calls.append("compile")
        return real_compile(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(builtins, "exec", counting_exec)
    monkeypatch.setattr(builtins, "compile", counting_compile)

    @record
    class Six:
        a: int
        b: str
        c: float = 0.0
        d: bool = False
        e: tuple[int, ...] = ()
        f: dict[str, int] = entry(default_factory=dict)

    Six(1, "b")
    assert calls == []

    @dataclasses.dataclass(frozen=True)
    class SixDataclass:
        a: int
        b: str

    assert (
        calls.count("exec") >= 4
    )  # what a frozen dataclass costs: __init__, __repr__, __eq__, __setattr__...
