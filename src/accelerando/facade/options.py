"""The Accelerator's constructor arguments, normalised, and the options its services share.

``Accelerator.__init__`` turns its arguments into a code layer of settings (:func:`code_settings`),
a kwargs-handler table (:func:`handlers_by_type`) and the plugin objects it always holds
(:func:`accumulation_plugin`, :func:`dataloader_config`, :func:`project_config`). The options that
several services read, and that a script may rebind on the Accelerator
(``accelerator.dataloader_config = DataLoaderConfiguration(...)``), live in one
:class:`AcceleratorOptions` record the services share.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from accelerando.plugins.accumulation import GradientAccumulationPlugin
from accelerando.plugins.dataloader import DataLoaderConfiguration
from accelerando.plugins.dynamo import TorchDynamoPlugin
from accelerando.plugins.kwargs_handler import KwargsHandler
from accelerando.plugins.project import ProjectConfiguration

if TYPE_CHECKING:
    from accelerando.core.settings import Settings

__all__ = [
    "AcceleratorOptions",
    "accumulation_plugin",
    "code_settings",
    "dataloader_config",
    "handlers_by_type",
    "project_config",
]


@dataclass(slots=True)
class AcceleratorOptions:
    """The Accelerator's options read by its services, shared by reference (rebinding one is seen by all).

    Attributes:
        dataloader_config: how prepared dataloaders shard, dispatch and pad batches.
        project_configuration: folders, checkpoint naming and rotation.
        device_placement: whether prepared models and batches move to the process's device by default.
        rng_types: the RNGs prepared dataloaders synchronise at each epoch start.
        step_scheduler_with_optimizer: whether prepared schedulers step with each real optimizer step.
    """

    dataloader_config: DataLoaderConfiguration
    project_configuration: ProjectConfiguration
    device_placement: bool = True
    rng_types: list[str] = field(default_factory=lambda: ["generator"])
    step_scheduler_with_optimizer: bool = True


def handlers_by_type(kwargs_handlers: list[KwargsHandler] | None) -> dict[type, object]:
    """Index ``kwargs_handlers`` by class.

    Raises:
        TypeError: an entry is not a ``KwargsHandler``.
        ValueError: two handlers of the same class were given.
    """
    found: dict[type, object] = {}
    for handler in kwargs_handlers or []:
        if not isinstance(handler, KwargsHandler):
            raise TypeError(
                f"kwargs_handlers accepts KwargsHandler instances (e.g. DistributedDataParallelKwargs()); "
                f"got {type(handler).__name__}"
            )
        if type(handler) in found:
            raise ValueError(f"kwargs_handlers has two {type(handler).__name__}; pass each kind once")
        found[type(handler)] = handler
    return found


def code_settings(
    mixed_precision: object,
    gradient_accumulation_steps: int | None,
    gradient_accumulation_plugin: GradientAccumulationPlugin | None,
    cpu: bool | None,
    dynamo_backend: object,
    dynamo_plugin: TorchDynamoPlugin | None,
) -> dict[str, object]:
    """The Accelerator's arguments that are settings, as a code layer (None = not given).

    Raises:
        ValueError: both ways of giving accumulation steps, or of giving a dynamo backend, were used.
    """
    if gradient_accumulation_plugin is not None and gradient_accumulation_steps not in (None, 1):
        raise ValueError(
            "pass either gradient_accumulation_steps or gradient_accumulation_plugin, not both; "
            "set num_steps on the plugin"
        )
    if dynamo_plugin is not None and dynamo_backend is not None:
        raise ValueError("pass either dynamo_backend or dynamo_plugin, not both")
    backend = getattr(dynamo_plugin, "backend", None) or dynamo_backend
    return {
        "mixed_precision": str(mixed_precision) if mixed_precision is not None else None,
        "gradient_accumulation_steps": getattr(gradient_accumulation_plugin, "num_steps", None)
        or gradient_accumulation_steps,
        "cpu": cpu,
        "dynamo_backend": str(backend or "").lower() or None,
    }


def accumulation_plugin(
    plugin: GradientAccumulationPlugin | None, settings: Settings
) -> GradientAccumulationPlugin:
    """``plugin`` (or a default one) with the resolved number of accumulation steps."""
    if plugin is None:
        plugin = GradientAccumulationPlugin()
    plugin.num_steps = int(settings.gradient_accumulation_steps)
    return plugin


def dataloader_config(
    config: DataLoaderConfiguration | None, split_batches: bool | None
) -> DataLoaderConfiguration:
    """``config`` (or a default one), with ``split_batches`` applied when given."""
    if config is None:
        config = DataLoaderConfiguration()
    if split_batches is not None:
        config.split_batches = split_batches
    return config


def project_config(config: ProjectConfiguration | None, project_dir: str | None) -> ProjectConfiguration:
    """``config`` (or a default one), with its folders set from ``project_dir`` when given."""
    if config is None:
        config = ProjectConfiguration()
    if project_dir is not None:
        config.set_directories(project_dir)
    return config
