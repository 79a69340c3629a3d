"""A DeepSpeed config that can be queried by dotted key: :class:`HfDeepSpeedConfig`.

This is the object ``transformers`` builds on (``transformers.integrations.deepspeed.HfDeepSpeedConfig``
subclasses it): it keeps the config dict in ``.config`` and answers questions such as "is this ZeRO-3?"
or "is anything offloaded?". Importing this module does not import ``deepspeed``.
"""

from __future__ import annotations

import base64
import binascii
import copy
import json
import os
from collections.abc import Mapping
from typing import Any

from accelerando.core.safe_files import FileTooLargeError, NotRegularFileError, read_regular

__all__ = ["HfDeepSpeedConfig"]

# Offload targets that move ZeRO state off the accelerator.
_OFFLOAD_DEVICES = frozenset({"cpu", "nvme"})


def _read_config(config_file_or_dict: object) -> dict[str, Any]:
    """Turn a dict, a JSON file path or a base64-encoded JSON string into a private dict."""
    if isinstance(config_file_or_dict, Mapping):
        # A deep copy: callers (and transformers' "auto" filling) edit the config in place.
        return copy.deepcopy(dict(config_file_or_dict))
    if isinstance(config_file_or_dict, os.PathLike) or (
        isinstance(config_file_or_dict, str) and os.path.exists(config_file_or_dict)
    ):
        path = os.fspath(config_file_or_dict)

        try:
            raw = read_regular(path, 64 * 2**20)  # a FIFO or /dev/zero would hang a plain read
        except (NotRegularFileError, FileTooLargeError) as error:
            raise ValueError(f"DeepSpeed config file: {error}; pass a JSON file or a dict") from None
        try:
            loaded = json.loads(raw.decode("utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise ValueError(f"DeepSpeed config file {path!r} is not valid JSON: {error}") from error
        if not isinstance(loaded, dict):
            raise ValueError(
                f"DeepSpeed config file {path!r} holds a JSON {type(loaded).__name__}, not an object"
            )
        return loaded
    if isinstance(config_file_or_dict, str):
        # The launcher passes configs through the environment as base64-encoded JSON.
        try:
            decoded = json.loads(base64.urlsafe_b64decode(config_file_or_dict).decode("utf-8"))
        except (binascii.Error, UnicodeDecodeError, json.JSONDecodeError, ValueError):
            decoded = None
        if isinstance(decoded, dict):
            return decoded
        raise ValueError(
            f"Expected a DeepSpeed config dict, an existing JSON file path or a base64-encoded JSON string, "
            f"got the string {config_file_or_dict[:80]!r}: no such file and not base64 JSON. Check the path."
        )
    raise ValueError(
        "Expected a DeepSpeed config dict, a JSON file path or a base64-encoded JSON string, got "
        f"{type(config_file_or_dict).__name__}."
    )


class HfDeepSpeedConfig:
    """Hold a DeepSpeed config dict and answer questions about it by dotted key.

    Args:
        config_file_or_dict: the config as a dict (copied), a path to a JSON file, or a base64-encoded
            JSON string.

    Attributes:
        config: the config dict; edit it in place to change the configuration.

    Raises:
        ValueError: the argument is none of the accepted forms, or the file is not a JSON object.
    """

    def __init__(self, config_file_or_dict: str | os.PathLike[str] | Mapping[str, object]) -> None:
        self.config: dict[str, Any] = _read_config(config_file_or_dict)
        self._stage: int = -1
        self._offload: bool = False
        self.set_stage_and_offload()

    def set_stage_and_offload(self) -> None:
        """Read the ZeRO stage and whether optimizer state or parameters are offloaded (CPU or NVMe).

        Call it again after editing ``config``: :meth:`is_zero2`, :meth:`is_zero3` and
        :meth:`is_offload` answer from what it read. Offloading only counts for ZeRO stages 2 and 3.
        """
        self._stage = self.get_value("zero_optimization.stage", -1)
        self._offload = False
        if self.is_zero2() or self.is_zero3():
            targets = {
                self.get_value("zero_optimization.offload_optimizer.device"),
                self.get_value("zero_optimization.offload_param.device"),
            }
            self._offload = bool(targets & _OFFLOAD_DEVICES)

    def find_config_node(self, ds_key_long: str) -> tuple[dict[str, Any] | None, str]:
        """Find the section holding a dotted key.

        Args:
            ds_key_long: e.g. ``"zero_optimization.offload_param.device"``.

        Returns:
            ``(section, last_key)``: the dict that holds (or would hold) ``last_key``, or
            ``(None, last_key)`` when an intermediate section is missing.
        """
        *parents, last = ds_key_long.split(".")
        node: object = self.config
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
            if node is None:
                return None, last
        return (node if isinstance(node, dict) else None), last

    def get_value(self, ds_key_long: str, default: object = None) -> Any:
        """Read a dotted key's value, or ``default`` when it (or a section above it) is absent.

        The value is a JSON value of the config (a number, string, list or section), hence ``Any``.
        """
        node, key = self.find_config_node(ds_key_long)
        if node is None:
            return default
        return node.get(key, default)

    def del_config_sub_tree(self, ds_key_long: str, must_exist: bool = False) -> None:
        """Remove a dotted key (and everything below it) from the config.

        Args:
            ds_key_long: e.g. ``"optimizer"`` or ``"zero_optimization.offload_param"``.
            must_exist: raise instead of doing nothing when the key is absent.

        Raises:
            ValueError: with ``must_exist``, when the key is not in the config.
        """
        node, key = self.find_config_node(ds_key_long)
        if node is None or key not in node:
            if must_exist:
                raise ValueError(
                    f"Cannot delete {ds_key_long!r}: it is not in the DeepSpeed config. "
                    "Pass must_exist=False to ignore absent keys."
                )
            return
        del node[key]

    def is_true(self, ds_key_long: str) -> bool:
        """True when the key exists and its value is truthy (absent keys are neither true nor false)."""
        value = self.get_value(ds_key_long)
        return value is not None and bool(value)

    def is_false(self, ds_key_long: str) -> bool:
        """True when the key exists and its value is falsy (absent keys are neither true nor false)."""
        value = self.get_value(ds_key_long)
        return value is not None and not bool(value)

    def is_zero2(self) -> bool:
        """Whether the config asks for ZeRO stage 2."""
        return self._stage == 2

    def is_zero3(self) -> bool:
        """Whether the config asks for ZeRO stage 3."""
        return self._stage == 3

    def is_offload(self) -> bool:
        """Whether ZeRO 2/3 offloads optimizer state or parameters to CPU or NVMe."""
        return self._offload

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(stage={self._stage}, offload={self._offload}, keys={sorted(self.config)})"
        )
