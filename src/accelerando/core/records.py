"""Light records: dataclass-style classes for the library's own bookkeeping, built without generated code.

``dataclasses.dataclass`` compiles source text for ``__init__``, ``__repr__``, ``__eq__`` (and, frozen,
``__setattr__``, ``__delattr__``, ``__hash__``) of every class it decorates: 0.8-1.4 ms a class on the
development machine, about 40 % of what ``from accelerando import Accelerator; Accelerator()`` cost
when the library's internal records were dataclasses. :func:`record` gives the same declaration
syntax (annotations, defaults, :func:`entry` for factories and non-init fields, ``__post_init__``)
with shared, pre-built methods: building a record class costs a few microseconds; constructing an
instance costs about what a dataclass's does.

Records are for internal state only. Public classes the reference defines as dataclasses (plugins,
kwargs handlers, configurations) stay dataclasses, because users call ``dataclasses.fields`` and
``asdict`` on them. Records are not dataclasses (``dataclasses.is_dataclass`` is False): use
:func:`replace` and :func:`field_names` here in place of the ``dataclasses`` functions.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

TYPE_CHECKING = False  # typing's constant, without importing typing (launcher start-up)
if TYPE_CHECKING:
    from typing import Any, TypeVar, overload

    from typing_extensions import dataclass_transform

    RecordT = TypeVar("RecordT")
    ValueT = TypeVar("ValueT")
else:  # only type checkers read the markers; typing_extensions imports inspect, which the launcher avoids

    def dataclass_transform(**_options: object) -> Callable[[RecordT], RecordT]:
        """At run time, leave the decorated function as it is."""
        return lambda function: function


_NO_DEFAULT = object()


class Entry:
    """What :func:`entry` declares about one field: its default or factory, and whether ``__init__`` takes it."""

    __slots__ = ("default", "default_factory", "init", "compare")

    def __init__(
        self, default: object, default_factory: Callable[[], object] | None, init: bool, compare: bool
    ) -> None:
        self.default = default
        self.default_factory = default_factory
        self.init = init
        self.compare = compare


if TYPE_CHECKING:  # the overloads are for type checkers only (typing.overload at run time costs an import)

    @overload
    def entry(*, default: ValueT, init: bool = True, compare: bool = True) -> ValueT: ...

    @overload
    def entry(
        *, default_factory: Callable[[], ValueT], init: bool = True, compare: bool = True
    ) -> ValueT: ...

    @overload
    def entry(*, init: bool = True, compare: bool = True) -> Any: ...


def entry(
    *,
    default: object = _NO_DEFAULT,
    default_factory: Callable[[], object] | None = None,
    init: bool = True,
    compare: bool = True,
) -> object:
    """Declare a record field with a factory (``entry(default_factory=dict)``) or outside ``__init__``.

    Args:
        default: the value when ``__init__`` is not given one.
        default_factory: called once per instance for the value when ``__init__`` is not given one.
        init: whether ``__init__`` takes the field; a non-init field without a default is set by
            ``__post_init__``.
        compare: whether ``==`` and ``hash`` look at the field.

    Returns:
        The declaration, read by :func:`record` (typed as the field's value for type checkers).

    Raises:
        ValueError: both a default and a factory given.
    """
    if default is not _NO_DEFAULT and default_factory is not None:
        raise ValueError("give a record field a default or a default_factory, not both")
    return Entry(default, default_factory, init, compare)


class _Layout:
    """The fields of one record class, resolved once when the class is decorated."""

    __slots__ = (
        "name",
        "init_names",
        "init_set",
        "init_only",
        "required",
        "defaults",
        "factories",
        "compared",
        "shown",
        "post_init",
    )

    def __init__(self, cls: type) -> None:
        self.name = cls.__qualname__
        inherited: _Layout | None = getattr(cls, "__record_layout__", None)
        self.init_names: list[str] = list(inherited.init_names) if inherited else []
        self.init_only: list[str] = list(inherited.init_only) if inherited else []
        self.required: set[str] = set(inherited.required) if inherited else set()
        self.defaults: dict[str, object] = dict(inherited.defaults) if inherited else {}
        self.factories: dict[str, Callable[[], object]] = dict(inherited.factories) if inherited else {}
        self.compared: list[str] = list(inherited.compared) if inherited else []
        self.shown: list[str] = list(inherited.shown) if inherited else []
        for name, annotation in cls.__dict__.get("__annotations__", {}).items():
            text = str(annotation)
            if text.startswith(("InitVar", "dataclasses.InitVar")):
                self._add_init_only(cls, name)
            elif not text.startswith(("ClassVar", "typing.ClassVar")):
                self._add_field(cls, name)
        self.init_set = frozenset(self.init_names)
        self.post_init = getattr(cls, "__post_init__", None) is not None

    def _add_init_only(self, cls: type, name: str) -> None:
        if name in cls.__dict__:
            raise TypeError(f"{self.name}: the init-only argument {name!r} cannot have a default")
        self.init_names.append(name)
        self.init_only.append(name)
        self.required.add(name)

    def _add_field(self, cls: type, name: str) -> None:
        declared = cls.__dict__.get(name, _NO_DEFAULT)
        spec = declared if isinstance(declared, Entry) else Entry(declared, None, True, True)
        if isinstance(declared, Entry):  # the class attribute keeps the plain default, as with dataclasses
            if spec.default is _NO_DEFAULT:
                delattr(cls, name)
            else:
                setattr(cls, name, spec.default)
        has_default = spec.default is not _NO_DEFAULT or spec.default_factory is not None
        if spec.init:
            if not has_default and any(n in self.defaults or n in self.factories for n in self.init_names):
                raise TypeError(f"{self.name}: field {name!r} without a default follows one with a default")
            self.init_names.append(name)
            if not has_default:
                self.required.add(name)
        if spec.default_factory is not None:
            self.factories[name] = spec.default_factory
        elif spec.default is not _NO_DEFAULT:
            self.defaults[name] = spec.default
        if spec.compare:
            self.compared.append(name)
        self.shown.append(name)

    def values(self, args: tuple[object, ...], kwargs: dict[str, object]) -> dict[str, object]:
        """The field values of one ``__init__`` call, defaults and factories filled in."""
        if args:
            if len(args) > len(self.init_names):
                raise TypeError(
                    f"{self.name}() takes {len(self.init_names)} positional arguments but {len(args)} were given"
                )
            positional = dict(zip(self.init_names, args, strict=False))
            repeated = positional.keys() & kwargs.keys()
            if repeated:
                raise TypeError(f"{self.name}() got multiple values for argument {min(repeated)!r}")
            kwargs = {**positional, **kwargs}
        unknown = kwargs.keys() - self.init_set
        if unknown:
            raise TypeError(f"{self.name}() got an unexpected keyword argument {min(unknown)!r}")
        missing = self.required - kwargs.keys()
        if missing:
            names = ", ".join(repr(name) for name in self.init_names if name in missing)
            raise TypeError(f"{self.name}() missing required arguments: {names}")
        values = {**self.defaults, **kwargs}
        for name, factory in self.factories.items():
            if name not in kwargs:
                values[name] = factory()
        return values


def _record_init(self: object, *args: object, **kwargs: object) -> None:
    layout: _Layout = type(self).__record_layout__  # type: ignore[attr-defined]
    values = layout.values(args, kwargs)
    init_only = [values.pop(name) for name in layout.init_only] if layout.init_only else ()
    self.__dict__.update(values)
    if layout.post_init:
        self.__post_init__(*init_only)  # type: ignore[attr-defined]


def _record_repr(self: object) -> str:
    layout: _Layout = type(self).__record_layout__  # type: ignore[attr-defined]
    shown = ", ".join(f"{name}={self.__dict__.get(name, '<unset>')!r}" for name in layout.shown)
    return f"{layout.name}({shown})"


def _compared(self: object) -> tuple[object, ...]:
    layout: _Layout = type(self).__record_layout__  # type: ignore[attr-defined]
    return tuple(self.__dict__.get(name) for name in layout.compared)


def _record_eq(self: object, other: object) -> bool:
    if other.__class__ is not self.__class__:
        return NotImplemented
    return _compared(self) == _compared(other)


def _record_hash(self: object) -> int:
    return hash(_compared(self))


def _refuse_setattr(self: object, name: str, value: object) -> None:
    # Imported here: the launcher uses records but not dataclasses (with inspect, ast and dis, about a
    # fifth of a one-process launch's start-up).
    from dataclasses import FrozenInstanceError

    raise FrozenInstanceError(f"cannot assign to field {name!r} of a frozen {type(self).__qualname__}")


def _refuse_delattr(self: object, name: str) -> None:
    from dataclasses import FrozenInstanceError

    raise FrozenInstanceError(f"cannot delete field {name!r} of a frozen {type(self).__qualname__}")


if TYPE_CHECKING:

    @overload
    @dataclass_transform(frozen_default=True, field_specifiers=(entry,))
    def record(cls: type[RecordT], /) -> type[RecordT]: ...

    @overload
    def record(*, frozen: bool = True) -> Callable[[type[RecordT]], type[RecordT]]: ...


def record(
    cls: type[RecordT] | None = None, /, *, frozen: bool = True
) -> type[RecordT] | Callable[[type[RecordT]], type[RecordT]]:
    """Make a class a record: ``__init__`` from its annotated fields, ``__repr__``, ``==`` and (frozen) ``hash``.

    Declared like a dataclass: annotated class attributes are the fields, in order; a value is the
    default; :func:`entry` gives a factory or keeps a field out of ``__init__``; a field annotated
    ``InitVar[...]`` is an ``__init__`` argument passed on to ``__post_init__`` and not stored;
    ``__post_init__`` runs after the fields are set. Frozen records (the default) refuse assignment
    after construction with ``dataclasses.FrozenInstanceError``; a frozen record's ``__post_init__``
    sets its non-init fields with ``object.__setattr__``.

    Args:
        cls: the class (when used as ``@record``).
        frozen: refuse assignment and deletion of attributes after ``__init__``.

    Returns:
        The same class, with the record methods set (those the class defines itself are kept).

    Raises:
        TypeError: a field without a default follows one with a default. The built ``__init__`` raises
            TypeError for unknown, repeated, missing or too many arguments, as a dataclass's does.
    """

    def decorate(target: type[RecordT]) -> type[RecordT]:
        target.__record_layout__ = _Layout(target)  # type: ignore[attr-defined]
        methods: dict[str, object] = {
            "__init__": _record_init,
            "__repr__": _record_repr,
            "__eq__": _record_eq,
        }
        if frozen:
            methods |= {
                "__hash__": _record_hash,
                "__setattr__": _refuse_setattr,
                "__delattr__": _refuse_delattr,
            }
        else:
            methods["__hash__"] = None  # mutable and compared by value: unhashable, as a dataclass
        for name, method in methods.items():
            if name not in target.__dict__ or (name == "__hash__" and target.__dict__[name] is None):
                setattr(target, name, method)
        return target

    return decorate if cls is None else decorate(cls)


def field_names(item: object) -> tuple[str, ...]:
    """The field names of a record class or instance, in declaration order.

    Raises:
        TypeError: ``item`` is not a record.
    """
    layout: _Layout | None = getattr(item, "__record_layout__", None)
    if layout is None:
        raise TypeError(f"{item!r} is not a record")
    return tuple(layout.shown)


def replace(item: RecordT, /, **changes: object) -> RecordT:
    """A copy of a record with some init fields changed (``dataclasses.replace`` for records).

    Args:
        item: a record instance.
        **changes: new values by field name.

    Returns:
        A new instance built by the class's ``__init__`` (so ``__post_init__`` runs again).

    Raises:
        TypeError: ``item`` is not a record.
        ValueError: a change names a field outside ``__init__``, or an init-only argument is not given.
    """
    layout: _Layout | None = getattr(type(item), "__record_layout__", None)
    if layout is None:
        raise TypeError(f"replace() takes a record, not {type(item).__qualname__}")
    missing = [name for name in layout.init_only if name not in changes]
    if missing:
        raise ValueError(f"{layout.name} cannot be copied without its init-only argument {missing[0]!r}")
    outside = changes.keys() - set(layout.init_names)
    if outside:
        raise ValueError(
            f"{layout.name}: field {min(outside)!r} is not set by __init__ and cannot be replaced"
        )
    current: Mapping[str, object] = item.__dict__
    kept = {
        name: current[name]
        for name in layout.init_names
        if name not in changes and name not in layout.init_only
    }
    return type(item)(**kept, **changes)
