"""Config files: find, load, validate, migrate and write them.

The files use the reference project's keys (``compute_environment``, ``distributed_type``,
``mixed_precision``, ``use_cpu``, ``fsdp_config: {...}``, ``deepspeed_config: {...}``, ...), so an
existing ``default_config.yaml`` works unchanged. Keys are checked against the settings table
(:mod:`accelerando.core.settings.fields`): an unknown key, a wrong type or an impossible combination is a
:class:`ConfigError` naming the file, the key, the allowed values and a close match.

Default location: ``$ACCELERANDO_CONFIG_FILE``, else ``$XDG_CACHE_HOME/accelerando/default_config.yaml``
(``~/.cache`` when XDG_CACHE_HOME is unset). When that file does not exist but the reference project's
default config does, that one is used and the caller is told so. ``ACCELERANDO_CONFIG_FILE`` must name
a regular file (a missing file, a folder or a FIFO is a :class:`ConfigError`, never silently
ignored); ``ACCELERANDO_CONFIG_FILE=/dev/null`` (``os.devnull``) means "no config file".
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from accelerando.core.safe_files import (
    FileTooLargeError,
    NotRegularFileError,
    describe_mode,
    read_regular,
    replace_file,
)
from accelerando.core.settings.fields import FIELDS, Field, get_field, quote_value
from accelerando.core.settings.resolve import Sourced, parse_value

# pathlib loads only where a path object is made: a launch without a config file looks for one with
# os.path alone (pathlib is a twentieth of a one-process launch; tests/launchers/test_launch_startup_work.py).
if TYPE_CHECKING:
    from pathlib import Path

__all__ = [
    "ConfigError",
    "CONFIG_KEYS",
    "default_config_path",
    "reference_config_path",
    "find_config_file",
    "read_config_file",
    "load_config_layer",
    "config_to_layer",
    "migrate_config",
    "settings_to_config",
    "write_config_file",
]

#: dotted config key -> field it sets.
CONFIG_KEYS: dict[str, Field] = {key: f for f in FIELDS for key in f.config_keys}
#: setting name -> its group, for the settings a config file can set.
CONFIG_KEYS_GROUP: dict[str, str] = {f.name: f.group for f in CONFIG_KEYS.values()}
_SECTIONS = frozenset(key.split(".")[0] for key in CONFIG_KEYS if "." in key)
# Keys the reference writes that do not map to a setting here: accepted and kept, never an error.
_ACCEPTED_TOP = frozenset(
    {
        "compute_environment", "tpu_env", "tpu_use_cluster", "tpu_use_sudo", "tpu_name", "tpu_zone",
        "tpu_vm", "commands", "command_file", "use_mps_device", "ipex_config", "ec2_instance_type",
        "iam_role_name", "image_uri", "profile", "region",
        "base_job_name", "pytorch_version", "transformers_version", "py_version", "additional_args",
        "sagemaker_inputs_file", "sagemaker_metrics_file",
    }
)  # fmt: skip
_ACCEPTED_NESTED = frozenset(
    {
        "deepspeed_config.deepspeed_exclusion_filter", "deepspeed_config.deepspeed_inclusion_filter",
        "fsdp_config.fsdp_backward_prefetch_policy",
    }
)  # fmt: skip
# Old spellings that `config update` rewrites and that loading accepts.
_RENAMED = {
    "dynamo_backend": "dynamo_config.dynamo_backend",
    "fsdp_config.fsdp_backward_prefetch_policy": "fsdp_config.fsdp_backward_prefetch",
}
# A `distributed_type` value in a file -> the switch setting it implies (a lookup table: which backend
# runs is decided by the connector, never by comparing names here).
_IMPLIED_SWITCH = {
    "FSDP": "use_fsdp",
    "DEEPSPEED": "use_deepspeed",
    "MEGATRON_LM": "use_megatron_lm",
    "MULTI_GPU": "multi_gpu",
}


class ConfigError(ValueError):
    """A config file that cannot be used; the message names the file, the key and the fix."""


def default_config_path() -> Path:
    """Return where our default config file lives (it may not exist).

    Returns:
        ``$ACCELERANDO_CONFIG_FILE`` if set, else ``<XDG cache>/accelerando/default_config.yaml``.
    """
    return _as_path(_default_config_text())


def _default_config_text() -> str:
    """:func:`default_config_path` as text, found with :mod:`os.path` alone."""
    explicit = os.environ.get("ACCELERANDO_CONFIG_FILE")
    if explicit:
        return os.path.expanduser(explicit)
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "accelerando", "default_config.yaml")


def reference_config_path() -> Path | None:
    """Return the reference project's default config file if one exists on this machine."""
    found = _reference_config_text()
    return None if found is None else _as_path(found)


def _reference_config_text() -> str | None:
    """:func:`reference_config_path` as text, found with :mod:`os.path` alone."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    hf_home = os.environ.get("HF_HOME") or os.path.join(cache, "huggingface")
    for name in ("default_config.yaml", "default_config.json"):
        candidate = os.path.join(hf_home, "accelerate", name)
        if os.path.isfile(candidate):
            return candidate
    return None


def find_config_file(explicit: str | os.PathLike[str] | None = None) -> tuple[Path | None, str]:
    """Choose the config file a launch uses.

    Args:
        explicit: ``--config_file`` as given, or ``None``.

    Returns:
        ``(path or None, note)``; ``note`` is a sentence to show the user when the choice is not
        obvious (the reference project's file was used), else ``""``.

    Raises:
        ConfigError: when ``explicit`` or ``$ACCELERANDO_CONFIG_FILE`` names a file that does not exist
            or is not a regular file (a directory, a device, a FIFO: the message says which).
    """
    if explicit is not None:
        return _regular_config(os.path.expanduser(os.fspath(explicit)), "the path given to --config_file"), ""
    configured = os.environ.get("ACCELERANDO_CONFIG_FILE")
    if configured:
        if configured == os.devnull:  # the documented spelling of "no config file"
            return None, ""
        return _regular_config(os.path.expanduser(configured), "ACCELERANDO_CONFIG_FILE (or unset it)"), ""
    # Found as text, with os.path alone: the common launch (no file anywhere) makes no path object.
    ours = _default_config_text()
    if os.path.isfile(ours):
        return _as_path(ours), ""
    reference = _reference_config_text()
    if reference is not None:
        return _as_path(reference), (
            f"No accelerando config at {ours}; using the reference project's config {reference}. "
            "Run `accelerando config update --config_file` on it to make your own copy."
        )
    return None, ""


def _regular_config(text: str, named_by: str) -> Path:
    """``Path(text)`` if it names a regular file (links followed), else a :class:`ConfigError` saying
    what it is and where the name came from (``named_by``).
    """
    path = _as_path(text)
    if not path.is_file():
        raise ConfigError(
            f"Config file {text!r} {_what_is(path)}. Fix: check {named_by}, or create one with "
            "`accelerando config`."
        )
    return path


def _as_path(text: str) -> Path:
    """``Path(text)``; pathlib is imported only here, where a path object is made."""
    from pathlib import Path

    return Path(text)


def read_config_file(path: str | os.PathLike[str]) -> dict[str, object]:
    """Read a YAML or JSON config file into a dict (no validation).

    Args:
        path: the file; ``.json`` is read as JSON, anything else as YAML.

    Returns:
        The file's top-level mapping (empty for an empty file).

    Raises:
        ConfigError: when the file cannot be parsed or is not a mapping.
    """
    import json
    from pathlib import Path

    path = Path(path)
    text = _read_text(path)
    try:
        if path.suffix == ".json":
            data = json.loads(text) if text.strip() else {}
        else:
            import yaml  # only config reading needs it

            # libyaml's loader when present: the same safe rules, and a huge file parses in seconds.
            data = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) or {}
    except Exception as err:  # noqa: BLE001 - any parser error becomes a message with the fix
        reason = str(err)
        reason = reason if len(reason) <= 300 else reason[:300] + " ..."  # parsers may quote whole lines
        raise ConfigError(
            f"Config file {str(path)!r} cannot be parsed: {reason}. Fix the syntax or regenerate it."
        ) from err
    if not isinstance(data, dict):
        raise ConfigError(
            f"Config file {str(path)!r} must hold a mapping of keys to values, not {type(data).__name__}."
        )
    return data


# A config file is a few KiB; one above this is refused before it is read.
MAX_CONFIG_BYTES = 64 * 2**20


def _what_is(path: Path) -> str:
    """Why ``path`` cannot be a config file, as the end of a sentence ("does not exist", "is a directory")."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return "does not exist"
    except OSError as err:
        return f"cannot be looked at ({err.strerror or err})"
    words = describe_mode(mode)
    return f"is {words}" if words == "a directory" else f"is {words}, not a regular file"


def _read_text(path: Path) -> str:
    """The file's text; a binary, special, huge or unreadable file is a :class:`ConfigError` saying what it is.

    The file is opened without blocking and checked to be a regular file (a FIFO or ``/dev/zero``
    named as a config file would otherwise hang the reader), and read no further than
    :data:`MAX_CONFIG_BYTES`.
    """
    fix = "Fix: pass a YAML or JSON config file (create one with `accelerando config`)."
    try:
        raw = read_regular(path, MAX_CONFIG_BYTES)
    except NotRegularFileError as err:
        what = err.what if err.what == "a directory" else f"{err.what}, not a regular file"
        raise ConfigError(f"Config file {str(path)!r} is {what}. {fix}") from None
    except FileTooLargeError as err:
        raise ConfigError(
            f"Config file {str(path)!r} is {err.size} bytes, more than the {MAX_CONFIG_BYTES} bytes a config "
            f"file may have. {fix}"
        ) from None
    except OSError as err:
        raise ConfigError(f"Config file {str(path)!r} cannot be read: {err.strerror or err}. {fix}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(
            f"Config file {str(path)!r} is not a text YAML/JSON config (byte {err.start} is not UTF-8 text; "
            f"is it a binary file?). {fix}"
        ) from None
    if "\x00" in text:
        raise ConfigError(
            f"Config file {str(path)!r} is not a text YAML/JSON config (it holds NUL bytes; is it a binary "
            f"file?). {fix}"
        )
    return text


def _flatten(data: Mapping[str, object]) -> dict[str, object]:
    flat: dict[str, object] = {}
    for key, value in data.items():
        if key in _SECTIONS and isinstance(value, Mapping):
            for sub, sub_value in value.items():
                flat[f"{key}.{sub}"] = sub_value
        else:
            flat[str(key)] = value
    return flat


def _unknown_key(path: str, key: str) -> ConfigError:
    import difflib

    known = sorted({*CONFIG_KEYS, *_ACCEPTED_TOP, *_SECTIONS})
    leaf = key.split(".")[-1]
    # A key hundreds of characters long matches nothing; comparing all of it would only take time.
    key_head, leaf_head = key[:200], leaf[:200]
    close = difflib.get_close_matches(key_head, known, n=1, cutoff=0.6) or difflib.get_close_matches(
        leaf_head, [k.split(".")[-1] for k in known], n=1, cutoff=0.6
    )
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return ConfigError(
        f"Config file {path!r}: unknown key {quote_value(key)}.{hint} Fix: rename or remove it "
        "(`accelerando config update` migrates old files)."
    )


def config_to_layer(data: Mapping[str, object], path: str) -> dict[str, Sourced]:
    """Validate a config mapping and turn it into a resolver layer labelled ``config:<path>``.

    Args:
        data: the file's content as read by :func:`read_config_file`.
        path: the file path, used in labels and messages.

    Returns:
        Setting name -> :class:`Sourced` for every key the file sets (``None`` values dropped).

    Raises:
        ConfigError: unknown key (with a close match), a value of the wrong type or outside the
            allowed values, or a compute environment this project does not support.
    """
    source = f"config:{path}"
    layer: dict[str, Sourced] = {}
    for key, raw in _flatten(data).items():
        key = _RENAMED.get(key, key)
        if key in _ACCEPTED_TOP or key in _ACCEPTED_NESTED:
            continue
        if key in _SECTIONS:  # a section that is not a mapping, e.g. `fsdp_config: null`
            if raw not in (None, {}):
                raise ConfigError(
                    f"Config file {path!r}: {key!r} must be a mapping of its options, got {quote_value(raw)}."
                )
            continue
        field = CONFIG_KEYS.get(key)
        if field is None:
            raise _unknown_key(path, key)
        try:
            value = parse_value(field, raw, source)
        except ValueError as err:
            raise ConfigError(f"Config file {path!r}, key {key!r}: {err}") from None
        if value is not None:
            layer[field.name] = Sourced(value, source)
    env = data.get("compute_environment", "LOCAL_MACHINE")
    if env not in (None, "LOCAL_MACHINE"):
        raise ConfigError(
            f"Config file {path!r}: compute_environment {quote_value(env)} is not supported. "
            "Fix: set it to 'LOCAL_MACHINE' (the only allowed value)."
        )
    _derive_switches(layer)
    return layer


def _derive_switches(layer: dict[str, Sourced]) -> None:
    """`distributed_type: FSDP` in a file means use_fsdp (and so on), as in the reference.

    A ``parallelism_config`` block that sets a size or backend means ``use_parallelism_config``.
    """
    blocks = [entry for name, entry in layer.items() if CONFIG_KEYS_GROUP.get(name) == "parallelism"]
    if blocks and "use_parallelism_config" not in layer:
        layer["use_parallelism_config"] = Sourced(True, blocks[0].source)
    dist = layer.get("distributed_type")
    if dist is None:
        return
    switch = _IMPLIED_SWITCH.get(dist.value) if isinstance(dist.value, str) else None
    if switch and switch not in layer:
        layer[switch] = Sourced(True, dist.source)


def load_config_layer(path: str | os.PathLike[str]) -> dict[str, Sourced]:
    """Read, validate and convert a config file into a resolver layer.

    Args:
        path: a YAML or JSON config file.

    Returns:
        The layer (see :func:`config_to_layer`).

    Raises:
        ConfigError: when the file cannot be read or is invalid.
    """
    return config_to_layer(read_config_file(path), str(path))


def migrate_config(data: Mapping[str, object]) -> dict[str, object]:
    """Rewrite an old config mapping with current key names, keeping every value.

    Args:
        data: a config mapping, possibly using old keys (top-level ``dynamo_backend``,
            ``fsdp_backward_prefetch_policy``, numeric FSDP sharding strategies).

    Returns:
        A new mapping in the current layout.
    """
    out: dict[str, object] = {}
    for key, value in _flatten(data).items():
        key = _RENAMED.get(key, key)
        field = CONFIG_KEYS.get(key)
        # Only another spelling of a choice is rewritten; a value already one of them keeps its type
        # (fsdp_version: 2 stays the integer the reference writes and reads back).
        if (
            field is not None
            and field.kind == "choice"
            and value is not None
            and str(value) not in (field.choices or ())
        ):
            try:
                value = parse_value(field, value, "config")
            except ValueError:
                pass  # leave it for validation to report with the file name
        _put(out, key, value)
    out.setdefault("compute_environment", "LOCAL_MACHINE")
    return out


def _put(out: dict[str, object], key: str, value: object) -> None:
    """Set ``out[key]``, or ``out[section][sub]`` for a ``section.sub`` key (creating the section).

    Raises:
        TypeError: ``out`` already holds ``section`` as something other than a mapping.
    """
    section, _, sub = key.partition(".")
    if not sub:
        out[key] = value
        return
    nested = out.setdefault(section, {})
    if not isinstance(nested, dict):
        raise TypeError(f"{section!r} is {type(nested).__name__}, not a mapping of its options")
    nested[sub] = value


def settings_to_config(values: Mapping[str, object]) -> dict[str, object]:
    """Build a config mapping (reference layout) from setting values.

    Args:
        values: setting name -> value; ``None`` values are left out.

    Returns:
        A mapping ready for :func:`write_config_file`.

    Raises:
        KeyError: for an unknown setting name.
    """
    out: dict[str, object] = {"compute_environment": "LOCAL_MACHINE"}
    for name, value in values.items():
        if value is None:
            continue
        key = get_field(name).config_keys[0]
        _put(out, key, list(value) if isinstance(value, tuple) else value)
    return out


def write_config_file(data: Mapping[str, object], path: str | os.PathLike[str]) -> Path:
    """Write a config mapping as YAML (or JSON for a ``.json`` path), creating parent folders.

    Args:
        data: the mapping to write.
        path: destination file.

    Returns:
        The path written.
    """
    from pathlib import Path

    path = Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".json":
        import json

        text = json.dumps(dict(data), indent=2, sort_keys=True) + "\n"
    else:
        import yaml

        text = yaml.safe_dump(dict(data), sort_keys=True)
    replace_file(path, text.encode("utf-8"))  # a fresh O_EXCL|O_NOFOLLOW temporary file, renamed over
    return path
