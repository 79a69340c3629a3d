"""Device maps: decide where each part of a model lives.

:func:`infer_auto_device_map` gives, for the same model and budgets, the same map as the reference
(users pin those maps in configuration files). It walks a list of *units* (modules, or single tensors
once a module is split) in forward order and fills the devices one after the other:

1. The first accelerator and the CPU ("main" devices) keep room for the largest unit that can not
   be split among those still to place: offloaded weights are brought there to run. That figure is
   updated when the units holding it have been taken, and after every split.
2. A unit goes on the current device when it fits there together with the units holding the other
   names of its tied parameters (tied weights share one device).
3. Otherwise, when the unit alone would fit, one of those tied units is split; else the unit itself
   is split into its own parameters and children, unless it is a leaf or a no-split class; else the
   walk moves to the next device (with ``fallback_allocation``, an empty device first takes the
   first later unit that fits there).

Each step costs time proportional to the unit's own size in the tree (the bookkeeping of the largest
unit is indexed by name), so models with tens of thousands of modules are planned quickly.
"""

from __future__ import annotations

import gc
import logging
import warnings
from collections import OrderedDict
from collections.abc import Mapping
from typing import TypeVar

import torch
from torch import nn

from accelerando.big_modeling.allocation import Unit, fallback_allocate, tied_partners, unit_parts
from accelerando.big_modeling.budgets import DeviceKey, as_class_name_list, get_max_memory
from accelerando.big_modeling.model_info import check_tied_parameters_in_config
from accelerando.big_modeling.sizes import compute_module_sizes, compute_module_total_buffer_size
from accelerando.big_modeling.tensors import find_tied_parameters

__all__ = ["check_device_map", "clean_device_map", "infer_auto_device_map"]

logger = logging.getLogger("accelerando.big_modeling.device_map")

DeviceMapT = TypeVar("DeviceMapT", bound="dict[str, DeviceKey]")


class _Scan:
    """The sizes every decision is made from (see :func:`compute_module_sizes`).

    Attributes:
        sizes: module and tensor name -> bytes; read with ``.get(name, 0)``.
    """

    def __init__(self, model: nn.Module, dtype, special_dtypes) -> None:
        self.sizes = compute_module_sizes(model, dtype=dtype, special_dtypes=special_dtypes)


def _scan(model: nn.Module, dtype, special_dtypes) -> _Scan:
    return _Scan(model, dtype, special_dtypes)


class _LargestUnit:
    """The largest unit that can not be split among the units still to place, with the names holding it.

    The size only changes when :meth:`compute` runs (at the start, after a split, or once every unit
    holding the current size has been taken), as in the reference: a unit moved to the next device
    keeps the reserve it caused.
    """

    def __init__(self, sizes, no_split: list[str]) -> None:
        self.sizes = sizes
        self.no_split = no_split
        self.size = 0
        self.names: set[str] = set()
        self._under: dict[str, set[str]] = {}

    def compute(self, units: list[Unit]) -> None:
        """Recompute from ``units`` (in order), splitting every splittable module down to its leaves."""
        best, names = 0, []
        pending = list(reversed(units))
        while pending:
            name, unit = pending.pop()
            children = list(unit.named_children()) if isinstance(unit, nn.Module) else []
            if not children or type(unit).__name__ in self.no_split:
                size = self.sizes.get(name, 0)
                if size > best:
                    best, names = size, [name]
                elif size == best:
                    names.append(name)
            else:
                pending.extend((f"{name}.{n}", child) for n, child in reversed(children))
        self.size = best
        self.names = set(names)
        self._under = {}
        for name in names:
            end = name.find(".")
            while end != -1:
                self._under.setdefault(name[:end], set()).add(name)
                end = name.find(".", end + 1)
            self._under.setdefault(name, set()).add(name)

    def take(self, name: str) -> bool:
        """Forget the names at or under unit ``name``; tell whether none is left."""
        for held in self._under.pop(name, ()):
            self.names.discard(held)
        return not self.names


def _clean_with_model(device_map: dict[str, DeviceKey], model: nn.Module) -> dict[str, DeviceKey]:
    """Merge entries into their parent only when every part of the parent (tensors, children) is mapped
    to one device, using the model's tree; keeps the model's module order.
    """
    result = dict(device_map)
    modules = list(model.named_modules())
    parts: dict[str, list[str]] = {}
    order: dict[str, None] = {}
    for name, module in modules:
        prefix = f"{name}." if name else ""
        tensors = [*module._parameters.items(), *module._buffers.items()]
        own = [prefix + n for n, t in tensors if t is not None]
        own += [prefix + n for n, c in module._modules.items() if c is not None]
        parts[name] = own
        order[name] = None
        order.update(dict.fromkeys(own))
    for name, _ in reversed(modules):
        own = parts[name]
        if name in result or not own or any(part not in result for part in own):
            continue
        targets = {result[part] for part in own}
        if len(targets) == 1:
            for part in own:
                del result[part]
            result[name] = targets.pop()
    ordered = {name: result[name] for name in order if name in result}
    ordered.update((name, device) for name, device in result.items() if name not in ordered)
    return ordered


def clean_device_map(
    device_map: DeviceMapT, module_name: str = "", *, model: nn.Module | None = None
) -> DeviceMapT:
    """Merge the entries below a module that all go to one device into one entry for that module.

    Works from the names alone, as the reference does: starting at ``module_name`` (the whole map for
    ``""``), when at least two entries lie under a module name (``name.``-prefixed, or every entry for
    ``""``) and all map to the same device, they are replaced by one entry for the module, added at
    the end of the map; otherwise each child name is examined the same way. A single entry is never
    renamed to its parent. ``device_map`` is updated in place and returned.

    Args:
        device_map: module (or tensor) name -> device.
        module_name: the module below which to merge (``""``: everywhere, so a map whose entries all
            name one device becomes ``{"": device}``).
        model: optionally the model the map describes (an accelerando extension); then the model's tree
            decides what a parent covers (an entry merges into its parent only when every part of that
            parent is mapped), and the order is the model's module order.

    Returns:
        ``device_map``, shortened.
    """
    if model is not None:
        cleaned = _clean_with_model(device_map, model)
        device_map.clear()
        device_map.update(cleaned)
        return device_map
    # A trie of the names under ``module_name``: node -> keys under it, node -> child nodes (first seen first).
    depth = len(module_name.split(".")) if module_name else 0
    prefix = f"{module_name}." if module_name else ""
    under: dict[str, list[str]] = {module_name: []}
    children: dict[str, dict[str, None]] = {}
    for key in device_map:
        if not key.startswith(prefix):
            continue
        under[module_name].append(key)
        pieces = key.split(".")
        parent = module_name
        for level in range(depth + 1, len(pieces) + 1):
            node = ".".join(pieces[:level])
            children.setdefault(parent, {})[node] = None
            if level < len(pieces):
                under.setdefault(node, []).append(key)
            parent = node
    pending = [module_name]
    while pending:
        node = pending.pop()
        keys = under.get(node, [])
        values = [device_map[key] for key in keys]
        if len(values) > 1 and len(set(values)) == 1:
            for key in keys:
                del device_map[key]
            device_map[node] = values[0]
            continue
        pending.extend(reversed(children.get(node, {})))
    return device_map


def check_device_map(model: nn.Module, device_map: dict[str, int | str | torch.device]) -> None:
    """Check that a device map gives a device to every parameter and persistent buffer of the model.

    An entry covers a tensor when it names the tensor or one of its parent modules (``""`` covers
    everything).

    Args:
        model: the model.
        device_map: module (or tensor) name -> device.

    Warns:
        UserWarning: for keys that name no submodule of the model (a tensor's name included), as the
            reference warns.

    Raises:
        ValueError: naming the tensors no entry covers, and how to fix the map.
    """
    modules = dict(model.named_modules())
    unknown = [key for key in device_map if key not in modules]
    if unknown:
        warnings.warn(
            f"The following device_map keys do not match any submodules in the model: {unknown}", stacklevel=2
        )
    if "" in device_map:
        return
    uncovered = []
    for name in model.state_dict(keep_vars=True):
        probe = name
        while probe and probe not in device_map:
            probe = probe.rpartition(".")[0]
        if not probe:
            uncovered.append(name)
    if uncovered:
        shown = ", ".join(uncovered[:10]) + (
            f" ... and {len(uncovered) - 10} more" if len(uncovered) > 10 else ""
        )
        raise ValueError(
            f"The device_map does not cover these tensors of the model (no device for them): {shown}. Add entries for their "
            "modules (or a '' entry for the whole model)."
        )


class _Planner:
    """State of one device-map computation (an object, so each step stays a short method).

    ``stack`` holds the units still to place, the next one last (the reference's list, reversed).
    """

    def __init__(self, model, budget, no_split, sizes, tied, options) -> None:
        self.devices: list[DeviceKey] = list(budget)
        if "disk" not in self.devices:
            self.devices.append("disk")
        accelerators = [d for d in self.devices if d not in ("cpu", "disk")]
        self.has_accelerators = bool(accelerators)
        self.main_devices = [accelerators[0], "cpu"] if accelerators else ["cpu"]
        self.budget = budget
        self.no_split = no_split
        self.sizes = sizes
        self.tied = tied
        self.dtype, self.special_dtypes, self.verbose, self.offload_buffers, self.fallback = options
        self.index = 0
        self.used = dict.fromkeys(self.devices, 0)
        self.buffer_sizes: dict[DeviceKey, int | float] = {}
        self.minimum: dict[DeviceKey, int] = {}
        self.device_map: OrderedDict[str, DeviceKey] = OrderedDict()
        units: list[Unit] = [
            *model.named_parameters(recurse=False),
            *model.named_children(),
            *model.named_buffers(recurse=False),
        ]
        self.stack: list[Unit] = list(reversed(units))
        self.largest = _LargestUnit(sizes, no_split)
        self.largest.compute(units)

    def log(self, message: str) -> None:
        if self.verbose:
            print(message)

    def in_order(self) -> list[Unit]:
        return list(reversed(self.stack))

    def set_order(self, units: list[Unit], recompute: bool = True) -> None:
        """Make ``units`` the units still to place; after a split, recompute the largest unit."""
        self.stack = list(reversed(units))
        if recompute:
            self.largest.compute([(n, u) for n, u in units if isinstance(u, nn.Module)])

    def run(self) -> OrderedDict[str, DeviceKey]:
        while self.stack:
            self.step(*self.stack.pop())
        return self.device_map

    def step(self, name: str, unit) -> None:
        self.log(f"\nTreating module {name}.")
        if self.largest.take(name):
            self.largest.compute([(n, u) for n, u in reversed(self.stack) if isinstance(u, nn.Module)])
        size = self.sizes.get(name, 0)
        groups, outside = tied_partners(name, self.tied)
        if groups:
            self.log(f"  Found the relevant tied param groups {groups}")
        if outside:
            self.log(f"  So those parameters need to be taken into account {outside}")
        device = self.devices[self.index]
        limit = None if device == "disk" else self.budget[device]
        reserved = 0
        if device in self.main_devices and limit is not None:  # "disk" (no limit) is never a main device
            limit -= self.largest.size
            reserved = self.largest.size
        with_ties, partner_names, partners = self.with_ties(outside, size)
        if limit is None or self.used[device] + with_ties <= limit:
            self.place(name, unit, device, size, limit, with_ties, partner_names)
        elif outside and self.used[device] + size <= limit and self.split_partner(name, unit, device, limit, with_ties, partner_names, partners):  # fmt: skip
            return
        elif self.used[device] + size >= limit and self.split(name, unit, device, limit, size):
            return
        elif not self.fall_back(name, unit, device, with_ties):
            self.next_device(name, unit, device, with_ties, reserved)

    def with_ties(self, outside: list[str], size) -> tuple[float, list[str], list]:
        """The unit's size with the units holding its tied partners (the reference's arithmetic)."""
        total, names, units = size, [], []
        if not outside:
            return total, names, units
        order = self.in_order()
        for param in outside:
            owner = next(((n, u) for n, u in order if param == n or param.startswith(f"{n}.")), None)
            if owner is not None:
                names.append(owner[0])
                units.append(owner[1])
                total += self.sizes.get(owner[0], 0) - self.sizes.get(param, 0)
        return total, names, units

    def place(self, name, unit, device, size, limit, with_ties, partner_names) -> None:
        if self.verbose:
            shown = f" and {partner_names}" if partner_names else f" (size={size})"
            room = f" (available={limit - self.used[device]})" if limit is not None else ""
            self.log(f"Putting {name}{shown}{room} on {device}.")
        self.used[device] += with_ties
        self.device_map[name] = device
        for partner in partner_names:
            position = next((i for i, (n, _) in enumerate(self.stack) if n == partner), None)
            if position is not None:
                del self.stack[position]
            self.device_map[partner] = device
        if not self.offload_buffers and isinstance(unit, nn.Module):
            buffers = compute_module_total_buffer_size(
                unit, dtype=self.dtype, special_dtypes=self.special_dtypes
            )
            self.buffer_sizes[device] = self.buffer_sizes.get(device, 0) + buffers

    def split_partner(self, name, unit, device, limit, with_ties, partner_names, partners) -> bool:
        """Split one of the tied partner units (the unit alone fits; with its partners it does not)."""
        self.log(
            f"Not enough space on {device} to put {name} and {partner_names} (space available "
            f"{limit - self.used[device]}, needed size {with_ties})."
        )
        for partner_name, partner in zip(partner_names, partners, strict=True):
            if type(partner).__name__ in self.no_split:
                continue
            parts = unit_parts(partner, partner_name)
            if not parts:
                continue
            self.log(f"Splitting {partner_name}.")
            order = self.in_order()
            position = next(i for i, (n, _) in enumerate(order) if n == partner_name)
            self.set_order([(name, unit), *order[:position], *parts, *order[position + 1 :]])
            return True
        self.log("None of the tied module can be split, going to the next device.")
        return False

    def split(self, name, unit, device, limit, size) -> bool:
        """Replace a unit that does not fit by its own parameters and children, when it may be split."""
        self.log(
            f"Not enough space on {device} to put {name} (space available {limit - self.used[device]}, "
            f"module size {size})."
        )
        parts = [] if type(unit).__name__ in self.no_split else unit_parts(unit, name)
        if not parts:
            self.log("This module cannot be split, going to the next device.")
            return False
        self.log(f"Splitting {name}.")
        self.set_order([*parts, *self.in_order()])
        return True

    def fall_back(self, name, unit, device, with_ties) -> bool:
        """On a device still empty, first place the first later unit that fits there (if asked)."""
        if not self.fallback or device == "disk" or self.used[device] != 0:
            return False
        room = self.budget[device] - max(self.largest.size, with_ties)
        found_name, found, remaining = fallback_allocate(
            self.in_order(), self.sizes, room - self.used[device], self.no_split, self.tied
        )
        if found is None or found_name is None:  # both None together: nothing fits
            return False
        # As in the reference, the largest unit is not recomputed here.
        self.set_order([(found_name, found), (name, unit), *remaining], recompute=False)
        return True

    def next_device(self, name, unit, device, with_ties, reserved) -> None:
        if self.used[device] == 0:
            self.minimum[device] = with_ties + reserved
        self.used[device] += reserved
        self.index += 1
        self.stack.append((name, unit))

    def warn_about_buffers(self) -> None:
        """Warn when the buffers of offloaded modules fit in no accelerator's remaining memory."""
        offloaded = self.buffer_sizes.get("cpu", 0) + self.buffer_sizes.get("disk", 0)
        if offloaded <= 0 or self.offload_buffers or not self.has_accelerators:
            return
        used = {device: mem for device, mem in self.used.items() if mem > 0}
        fits = any(
            self.budget[device] >= offloaded + used.get(device, 0)
            for device in self.budget
            if device not in ("cpu", "disk")
        )
        if not fits:
            warnings.warn(
                f"Current model requires {offloaded} bytes of buffer for offloaded layers, which seems does "
                "not fit any GPU's remaining memory. If you are experiencing a OOM later, please consider "
                "using offload_buffers=True.",
                stacklevel=3,
            )

    def report_minimum(self) -> None:
        if not self.minimum:
            return
        lines = "\n".join(f"  - {device}: {memory} bytes required" for device, memory in self.minimum.items())
        logger.info(
            "Based on the current allocation process, no modules could be assigned to the following devices due "
            f"to insufficient memory:\n{lines}\nThese minimum requirements are specific to this allocation "
            "attempt and may vary. Consider increasing the available memory for these devices to at least the "
            "specified minimum, or adjusting the model config."
        )


def infer_auto_device_map(
    model: nn.Module,
    max_memory: Mapping[DeviceKey, int | float | str] | None = None,
    no_split_module_classes: list[str] | set[str] | str | None = None,
    dtype: torch.dtype | str | None = None,
    special_dtypes: Mapping[str, torch.dtype | str] | None = None,
    verbose: bool = False,
    clean_result: bool = True,
    offload_buffers: bool = False,
    fallback_allocation: bool = False,
) -> OrderedDict[str, DeviceKey]:
    """Compute a device map: fill the accelerators in order, then the CPU, then the disk.

    The result is the reference's for the same inputs (see the module docstring for the walk). A
    module whose class name is in ``no_split_module_classes`` is never split; tied parameters land on
    one device; the first accelerator and the CPU keep room for the largest unsplittable unit still
    to place, which is brought to the execution device to run when offloaded.

    Args:
        model: the model to place (build it under :func:`init_empty_weights` to allocate nothing).
        max_memory: budgets per device (bytes or strings like ``"10GiB"``); free memory when None.
        no_split_module_classes: class names whose instances stay on one device (residual blocks).
        dtype: count floating-point weights in this dtype (the dtype you will load in).
        special_dtypes: per-tensor dtype overrides.
        verbose: print each decision (placement, split, move to the next device) and why.
        clean_result: merge entries that share a device into their parent (:func:`clean_device_map`).
        offload_buffers: offloaded modules also offload their buffers (no warning about their size).
        fallback_allocation: when the next unit does not fit on an empty device, put there the first
            later unit that does fit instead of leaving the device empty.

    Returns:
        An ordered dict from module (or tensor) names to a device: an accelerator index, ``"mps"``,
        ``"cpu"`` or ``"disk"``.

    Warns:
        UserWarning: when the buffers of the modules offloaded to CPU or disk fit in no accelerator's
            remaining memory (and ``offload_buffers`` is False).

    Raises:
        ValueError: for an unknown device or unreadable size in ``max_memory``.

    Example:
        >>> import torch
        >>> from accelerando import infer_auto_device_map, init_empty_weights
        >>> with init_empty_weights():
        ...     model = torch.nn.Sequential(*[torch.nn.Linear(1000, 1000) for _ in range(3)])  # 4 MB each
        >>> dict(infer_auto_device_map(model, max_memory={0: "10MB", "cpu": "1GB"}))
        {'0': 0, '1': 'cpu', '2': 'cpu'}
    """
    budget = get_max_memory(max_memory)
    no_split_module_classes = as_class_name_list(no_split_module_classes)
    # The cyclic garbage collector scans the whole heap (the model's objects included) each time it
    # runs, which would slow this pass down on large models; nothing here creates cycles.
    collecting = gc.isenabled()
    gc.disable()
    try:
        sizes = _scan(model, dtype, special_dtypes).sizes
        tied = find_tied_parameters(model)
        if not tied and check_tied_parameters_in_config(model):
            logger.warning(
                "The model weights are not tied. Please use the `tie_weights` method before using the "
                "`infer_auto_device` function."
            )
        options = (dtype, special_dtypes, verbose, offload_buffers, fallback_allocation)
        planner = _Planner(model, budget, list(no_split_module_classes), sizes, tied, options)
        device_map = planner.run()
    finally:
        if collecting:
            gc.enable()
    if clean_result:
        device_map = clean_device_map(device_map)
    planner.warn_about_buffers()
    planner.report_minimum()
    return device_map
