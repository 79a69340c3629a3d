"""Merge ordered layers of raw values into one frozen :class:`Settings` with provenance.

A *layer* maps setting names to :class:`Sourced` raw values (a value plus a label saying where it came
from: ``"env:ACCELERATE_MIXED_PRECISION"``, ``"config:/path.yaml"``, ``"cli:--cpu"``, ``"code"``).
:func:`resolve` applies the layers in order on top of the defaults: a later layer wins, and a value of
``None`` ("not given") never wins. Each raw value is parsed and validated against its
:class:`~accelerando.core.settings.fields.Field` row, so a bad value is reported with its source.

Who calls what:
    * each process: :func:`resolve_runtime_settings` (defaults < environment < code);
    * the launcher: :func:`resolve` with (config file, CLI flags) layers built by
      :mod:`accelerando.core.settings.configfile` and :mod:`accelerando.commands.launch`.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from accelerando.core.settings.fields import (
    FIELDS,
    FIELDS_BY_NAME,
    Field,
    fields_in_group,
    get_field,
    quote_value,
)

if TYPE_CHECKING:
    # The typed attributes generated from the table (core/settings/codegen.py); the type checker
    # sees every setting as a property of Settings, run time never imports the module.
    from accelerando.core.settings.attributes import SettingAttributes
else:
    SettingAttributes = object

__all__ = [
    "Sourced",
    "SOURCES_ENV",
    "ECHOED_DEFAULTS_ENV",
    "environment_setting",
    "Layer",
    "Settings",
    "parse_value",
    "resolve",
    "env_layer",
    "environment_value",
    "code_layer",
    "resolve_runtime_settings",
    "process_settings",
    "forget_process_settings",
    "environment_hidden",
]

# The logger is looked up when a warning is due: logging (and its traceback, threading, string) is a
# tenth of a one-process launch's start-up, which never warns (tests/launchers/test_launch_startup_work.py).
_LOGGER = "accelerando.core.settings"

_TRUE = frozenset({"1", "true", "yes", "y", "on", "t"})
_FALSE = frozenset({"0", "false", "no", "n", "off", "f", "none", ""})


#: Variable in which the launcher tells each process where it found every value it exported.
SOURCES_ENV = "ACCELERANDO_SOURCES"

#: Variable in which the launcher lists the reference variables it wrote with a *default* value (the
#: reference's launcher always writes e.g. ``ACCELERATE_MIXED_PRECISION=no``). A variable still holding
#: that value reads as "not set", so it never counts as a choice that code would override.
ECHOED_DEFAULTS_ENV = "ACCELERANDO_ECHOED_DEFAULTS"


@dataclasses.dataclass(frozen=True, slots=True)
class Sourced:
    """A raw value, the label of the place it came from, and where that place got it (if known).

    ``origin`` is set for values the launcher exported: the source it resolved them from
    (``"config:/path.yaml"``, ``"cli:--mixed_precision"``), while ``source`` is the variable read.
    """

    value: object
    source: str
    origin: str | None = None


Layer = Mapping[str, Sourced]


def _bad(field: Field, raw: object, source: str, reason: str = "") -> ValueError:
    where = source if source != "code" else "code (an argument)"
    fix = f"Fix: set {field.name!r} to {field.describe_allowed()}"
    if source.startswith("env:"):
        fix += f" in {source[4:]}, or unset that variable"
    elif source.startswith("config:"):
        fix += f" in {source[7:]}"
    return ValueError(
        f"Invalid value {quote_value(raw)} for setting {field.name!r} (from {where}): "
        f"{reason + '; ' if reason else ''}expected {field.describe_allowed()}. {fix}."
    )


def _parse_bool(field: Field, raw: object, source: str) -> bool:
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, int) and raw in (0, 1):
        return bool(raw)
    if isinstance(raw, str):
        low = raw.strip().lower()
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
    raise _bad(field, raw, source)


# Any: int() and float() take whatever defines __int__ / __float__ (NumPy scalars...), refusing the rest.
def _parse_number(field: Field, raw: Any, source: str) -> int | float | str:
    number: int | float
    if isinstance(raw, str) and raw.strip().lower() in (field.choices or ()):
        return raw.strip().lower()  # a named value a number field also accepts ("auto")
    try:
        if isinstance(raw, bool):
            raise ValueError
        if field.kind == "int":
            if isinstance(raw, float) and not raw.is_integer():
                raise ValueError
            number = int(raw.strip()) if isinstance(raw, str) else int(raw)
        else:
            number = float(raw)
    except (TypeError, ValueError, OverflowError):
        raise _bad(field, raw, source) from None
    return _check_bounds(field, number, raw, source)


def _check_bounds(field: Field, number: int | float, raw: object, source: str) -> int | float:
    if not math.isfinite(number):  # nan passes every comparison below
        raise _bad(field, raw, source)
    if field.minimum is not None and number < field.minimum:
        raise _bad(field, raw, source)
    if field.maximum is not None and number > field.maximum:
        raise _bad(field, raw, source)
    return number


def _parse_text(field: Field, parser: Callable[[str], object], raw: str, source: str) -> object:
    """Read ``raw`` with the field's own parser; a number it returns is still held to the bounds."""
    try:
        value = parser(raw)
    except ValueError as err:
        raise _bad(field, raw, source, str(err)) from None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return _check_bounds(field, value, raw, source)
    return value


def _parse_choice(field: Field, raw: object, source: str) -> str:
    text = str(raw).strip()
    if isinstance(raw, bool):  # YAML turns a bare `no` into False
        text = "no" if not raw else "yes"
    low = text.lower()
    for choice in field.choices or ():
        if choice.lower() == low:
            return choice
    if low in field.aliases:
        return field.aliases[low]
    raise _bad(field, raw, source)


# Returns Any: a setting's value, whose type is its field's kind (bool, int, str...).
def parse_value(field: Field | str, raw: object, source: str = "code") -> Any:
    """Parse and validate one raw value for a field.

    Args:
        field: the :class:`Field` or its name.
        raw: the value as written (a string from the environment or CLI, or a typed value).
        source: label of where ``raw`` came from, used in the error message.

    Returns:
        The value in the field's type, or for text what the field's own ``parser`` returns (e.g.
        ``num_machines``: ``"1:4"`` stays text); ``None`` stays ``None``.

    Raises:
        ValueError: when ``raw`` is not allowed; the message names the setting, its source and the
            allowed values (and the field parser's reason, when it refused the text).
    """
    fld = get_field(field) if isinstance(field, str) else field
    if raw is None:
        return None
    if fld.parser is not None and isinstance(raw, str):
        return _parse_text(fld, fld.parser, raw, source)
    if fld.kind == "bool":
        return _parse_bool(fld, raw, source)
    if fld.kind in ("int", "float"):
        return _parse_number(fld, raw, source)
    if fld.kind == "choice":
        return _parse_choice(fld, raw, source)
    if fld.kind == "list":
        items = raw.split(",") if isinstance(raw, str) else raw
        if not isinstance(items, (list, tuple)):
            raise _bad(fld, raw, source)
        return tuple(str(i).strip() for i in items if str(i).strip())
    if isinstance(raw, (dict, list, tuple)):
        raise _bad(fld, raw, source)
    return str(raw).lower() if isinstance(raw, bool) else str(raw)


# No slots: with them, the frozen ``__setattr__`` of Python 3.10 and 3.11 raises TypeError instead of
# FrozenInstanceError for a name that is not a dataclass field, and every setting is such a name.
@dataclasses.dataclass(frozen=True)
class Settings(SettingAttributes):
    """Resolved values of every setting, each with the label of the layer that set it.

    Read a value as an attribute (``settings.mixed_precision``, typed from its row of the table by
    :mod:`accelerando.core.settings.attributes`) and its origin with :meth:`source`. Instances are
    immutable; build a new one with :func:`resolve`.

    Attributes:
        values: setting name -> resolved value.
        sources: setting name -> ``"default"``, ``"env:NAME"``, ``"config:<path>"``,
            ``"cli:--flag"`` or ``"code"``.
    """

    values: Mapping[str, object]
    sources: Mapping[str, str]
    origins: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        # Every value is also an instance attribute, so reading a setting is a plain attribute lookup
        # (no Python-level call; it was a __getattr__ call per read). The frozen __setattr__ still
        # refuses writes; ``values`` stays the mapping the class describes.
        self.__dict__.update(self.values)

    if not TYPE_CHECKING:  # for the type checker a name that is no setting is an error, not Any

        def __getattr__(self, name: str) -> object:
            raise AttributeError(f"Settings has no field {name!r}")

    def __getitem__(self, name: str) -> Any:
        return self.values[get_field(name).name]

    def source(self, name: str) -> str:
        """Return where setting ``name`` came from.

        Args:
            name: a setting name.

        Returns:
            ``"default"``, ``"env:<VAR>"``, ``"config:<path>"``, ``"cli:--flag"`` or ``"code"``.

        Raises:
            KeyError: for an unknown setting name.
        """
        return self.sources[get_field(name).name]

    def origin(self, name: str) -> str:
        """Return where a value came from before the launcher passed it on.

        Args:
            name: a setting name.

        Returns:
            For a value the launcher exported, the launcher's source (``"config:/x.yaml"``,
            ``"cli:--mixed_precision"``, ...); otherwise the same as :meth:`source`.

        Raises:
            KeyError: for an unknown setting name.
        """
        key = get_field(name).name
        return self.origins.get(key, self.sources[key])

    def items(self) -> Iterator[tuple[str, object, str]]:
        """Yield ``(name, value, source)`` for every setting, in table order."""
        for f in FIELDS:
            yield f.name, self.values[f.name], self.sources[f.name]

    def group(self, name: str) -> dict[str, object]:
        """Return the resolved values of one group (``"fsdp"``, ``"deepspeed"``, ``"dynamo"``, ...).

        Args:
            name: a group name from :data:`accelerando.core.settings.fields.GROUPS`.

        Returns:
            A new dict of setting name -> value for that group.

        Raises:
            ValueError: for an unknown group name.
        """
        return {f.name: self.values[f.name] for f in fields_in_group(name)}

    def as_dict(self) -> dict[str, object]:
        """Return a plain copy of every resolved value."""
        return dict(self.values)

    def explicitly_set(self) -> dict[str, object]:
        """Return the values that some layer set (the source is not ``"default"``)."""
        return {k: v for k, v in self.values.items() if self.sources[k] != "default"}

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={v!r}" for k, v in self.explicitly_set().items())
        return f"Settings({shown})"


def _check_layer_names(layer: Layer) -> None:
    for name in layer:
        if name not in FIELDS_BY_NAME:
            get_field(name)  # raises KeyError with a "did you mean"


def resolve(
    layers: Sequence[Layer], *, warn_sources: tuple[str, ...] = ("code",), base: Settings | None = None
) -> Settings:
    """Merge ``layers`` (lowest precedence first) on top of the defaults (or of ``base``).

    Args:
        layers: mappings of setting name -> :class:`Sourced`; later layers win, ``None`` never wins.
        warn_sources: when a value from a layer whose label is in this tuple replaces a *different*
            value set by an earlier non-default layer, one warning lists every such override.
        base: settings already resolved from lower layers; the defaults when None.

    Returns:
        The frozen :class:`Settings`.

    Raises:
        ValueError: when a value is not allowed for its setting.
        KeyError: when a layer names an unknown setting.
    """
    if base is None:
        values: dict[str, object] = {f.name: f.default for f in FIELDS}
        sources: dict[str, str] = dict.fromkeys(values, "default")
        origins: dict[str, str] = {}
    else:
        values, sources, origins = dict(base.values), dict(base.sources), dict(base.origins)
    overrides: list[str] = []
    for layer in layers:
        _check_layer_names(layer)
        for name, entry in layer.items():
            value = parse_value(FIELDS_BY_NAME[name], entry.value, entry.source)
            if value is None:
                continue
            if entry.source in warn_sources and sources[name] != "default" and values[name] != value:
                where = sources[name] + (f" (the launcher's {origins[name]})" if name in origins else "")
                overrides.append(
                    f"{name}={value!r} from {entry.source} overrides {values[name]!r} from {where}"
                )
            values[name], sources[name] = value, entry.source
            origins.pop(name, None)
            if entry.origin and entry.origin != entry.source:
                origins[name] = entry.origin
    if overrides:
        import logging

        logging.getLogger(_LOGGER).warning(
            "Explicit settings override the launcher/environment: %s", "; ".join(overrides)
        )
    return Settings(values=values, sources=sources, origins=origins)


def env_layer(environ: Mapping[str, str] | None = None) -> dict[str, Sourced]:
    """Read every setting from environment variables.

    Our ``ACCELERANDO_*`` name is read first; when it is unset the reference project's names are
    tried in order. An empty string counts as unset.

    Args:
        environ: the environment to read; ``None`` reads ``os.environ``.

    Returns:
        A layer for :func:`resolve`, labelled ``env:<VAR>`` per value.
    """
    env = _environ() if environ is None else environ
    launcher_sources = _launcher_sources(env)
    echoed = _echoed_defaults(env)
    layer: dict[str, Sourced] = {}
    for f in FIELDS:
        found = _first_variable(f, env, echoed)
        if found is not None:
            var, raw = found
            origin = launcher_sources.get(f.name) if var == f.our_env else None
            layer[f.name] = Sourced(raw, "env:" + var, origin)
    return layer


def _first_variable(
    field: Field, env: Mapping[str, str], echoed: Mapping[str, str] | None = None
) -> tuple[str, str] | None:
    """The first of the field's variables set to a non-empty value (not a launcher's echoed default)."""
    for var in field.env_names:
        raw = env.get(var)
        if raw is not None and raw != "" and (echoed is None or echoed.get(var) != raw):
            return var, raw
    return None


def _echoed_defaults(env: Mapping[str, str]) -> dict[str, str]:
    text = env.get(ECHOED_DEFAULTS_ENV)
    if not text:
        return {}
    import json

    try:
        data = json.loads(text)
    except ValueError:  # written by our launcher; a damaged value only makes the echoes count as set
        return {}
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


_ENVIRONMENT_HIDDEN: ContextVar[bool] = ContextVar("accelerando_environment_hidden", default=False)


@contextmanager
def environment_hidden() -> Iterator[None]:
    """Within the block, every reader of this package sees an empty process environment.

    ``os.environ`` itself is left alone (other threads keep seeing it): only
    :func:`process_settings`, :func:`environment_value`, :func:`environment_setting` and
    :func:`environment_text` answer as if no variable were set. Used to build an object "with nothing
    given", e.g. the defaults a kwargs handler compares itself with in ``to_kwargs()``.

    Example:
        >>> with environment_hidden():
        ...     process_settings().source("mixed_precision")
        'default'
    """
    token = _ENVIRONMENT_HIDDEN.set(True)
    try:
        yield
    finally:
        _ENVIRONMENT_HIDDEN.reset(token)


def _environ() -> Mapping[str, str]:
    return {} if _ENVIRONMENT_HIDDEN.get() else os.environ


def environment_value(name: str) -> Any:
    """One setting as the environment gives it, read through the table (no whole resolution).

    For code that must work before any state exists (loggers created at import time).

    Args:
        name: a setting name (``"log_level"``, ``"debug"``...).

    Returns:
        The parsed value, or None when no variable of the setting is set.

    Raises:
        ValueError: the variable holds a value the setting does not allow.
        KeyError: an unknown setting name.
    """
    field = get_field(name)
    env = _environ()
    found = _first_variable(field, env, _echoed_defaults(env))
    return None if found is None else parse_value(field, found[1], "env:" + found[0])


def environment_text(name: str, default: str | None = None) -> str | None:
    """The raw text of one environment variable that has no row in the settings table.

    Variables that are settings are read with :func:`environment_setting` (parsed, with provenance);
    this is for the few that are not, e.g. the ``PARALLELISM_CONFIG_*`` handler options that the
    parallelism dataclasses read themselves, so that every read of the process environment goes
    through this package.

    Args:
        name: the variable's name.
        default: returned when the variable is not set.

    Returns:
        The variable's text, or ``default``.
    """
    return _environ().get(name, default)


def environment_setting(name: str) -> Any:
    """One setting as this process's environment gives it, else the setting's default.

    The call for code outside the settings package that reads a reference ``ACCELERATE_*`` variable
    (``environment_setting("init_include_buffers")`` instead of parsing
    ``ACCELERATE_INIT_INCLUDE_BUFFERS`` by hand): every spelling of the variable, ours first, parsed
    and checked as the settings table says.

    Args:
        name: a setting name (``"init_include_buffers"``, ``"torch_device"``, ``"bypass_device_map"``...).

    Returns:
        The parsed value from the environment, or the table's default when no variable is set.

    Raises:
        ValueError: a variable holds a value the setting does not allow (the message names it).
        KeyError: an unknown setting name.

    Example:
        >>> import os
        >>> os.environ["ACCELERATE_BYPASS_DEVICE_MAP"] = "true"
        >>> environment_setting("bypass_device_map")
        True
        >>> del os.environ["ACCELERATE_BYPASS_DEVICE_MAP"]
    """
    value = environment_value(name)
    return get_field(name).default if value is None else value


def _launcher_sources(env: Mapping[str, str]) -> dict[str, str]:
    text = env.get(SOURCES_ENV)
    if not text:
        return {}
    import json

    try:
        data = json.loads(text)
    except ValueError:  # written by our launcher; a hand-edited value only loses provenance
        return {}
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def code_layer(values: Mapping[str, object] | None) -> dict[str, Sourced]:
    """Wrap arguments given in code as a layer (``None`` values mean "not given" and are dropped).

    Args:
        values: setting name -> value, e.g. the Accelerator's keyword arguments.

    Returns:
        A layer for :func:`resolve`, labelled ``"code"``.

    Raises:
        KeyError: when a name is not a known setting.
    """
    layer = {k: Sourced(v, "code") for k, v in (values or {}).items() if v is not None}
    _check_layer_names(layer)
    return layer


def _environment_fingerprint(env: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """The values of every variable a setting is read from (what decides the environment layer)."""
    names = _ENV_NAMES or _collect_env_names()
    return tuple((name, env[name]) for name in names if name in env)


_ENV_NAMES: list[str] = []


def _collect_env_names() -> list[str]:
    _ENV_NAMES.extend(
        sorted({var for f in FIELDS for var in f.env_names} | {SOURCES_ENV, ECHOED_DEFAULTS_ENV, "RANK"})
    )
    return _ENV_NAMES


_process_cache: dict[str, object] = {}


def process_settings() -> Settings:
    """The settings the environment gives this process (defaults < environment), resolved once.

    Every consumer in a process (the connector building an Accelerator's runtime, plugins filling
    their unset fields) reads this one result instead of resolving again. It is resolved anew only
    when a variable a setting is read from has changed since (tests and notebooks change them).

    Returns:
        The frozen :class:`Settings` of the environment layer.

    Raises:
        ValueError: when an environment value is not allowed (the message names the variable and fix).
    """
    if _ENVIRONMENT_HIDDEN.get():
        return resolve([env_layer({})], warn_sources=())
    # One copy of the environment: os.environ answers each of the ~500 names a setting may be read
    # from (most unset) through Python-level calls and a KeyError; a dict answers them in C.
    environ = dict(os.environ)
    fingerprint = _environment_fingerprint(environ)
    if _process_cache.get("fingerprint") != fingerprint:
        _process_cache["settings"] = resolve([env_layer(environ)], warn_sources=())
        _process_cache["fingerprint"] = fingerprint
    settings = _process_cache["settings"]
    assert isinstance(settings, Settings)  # only this function writes it
    return settings


def forget_process_settings() -> None:
    """Drop the remembered process settings (the next reader resolves the environment again)."""
    _process_cache.clear()


def resolve_runtime_settings(
    code: Mapping[str, object] | None = None, environ: Mapping[str, str] | None = None
) -> Settings:
    """Resolve the settings of the running process: defaults < environment < code.

    The environment carries what the launcher resolved (config file and CLI flags) or what the user
    exported; an argument given in code always wins, with one warning (on the process of rank 0 only)
    when it replaces a different value from the environment. Without ``environ`` the environment layer
    is the one :func:`process_settings` resolved once for the process; only the code layer is added.

    Args:
        code: setting name -> value given in code; ``None`` values mean "not given".
        environ: the environment to read; ``None`` reads ``os.environ``.

    Returns:
        The frozen :class:`Settings`.

    Raises:
        ValueError: when a value is not allowed (the message names the setting, source and fix).
        KeyError: when ``code`` names an unknown setting.

    Example:
        >>> s = resolve_runtime_settings({"mixed_precision": "bf16"}, environ={})
        >>> s.mixed_precision, s.source("mixed_precision")
        ('bf16', 'code')
    """
    # Every process resolves the same values; only the first one says that code overrode the launcher.
    if environ is None:
        first_process = os.environ.get("RANK", "0") == "0"
        base = process_settings()
        return resolve([code_layer(code)], warn_sources=("code",) if first_process else (), base=base)
    first_process = environ.get("RANK", "0") == "0"
    return resolve([env_layer(environ), code_layer(code)], warn_sources=("code",) if first_process else ())
