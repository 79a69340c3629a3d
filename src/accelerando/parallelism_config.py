"""ParallelismConfig: how the processes of a job are laid out on a device mesh.

Five axes, each of size 1 when unused: ``dp_replicate`` (plain data-parallel copies), ``dp_shard``
(FSDP sharding), ``cp`` (context parallel), ``sp`` (DeepSpeed Ulysses sequence parallel) and ``tp``
(tensor parallel). Their sizes multiply to the number of processes. Besides the raw axes, the mesh
carries three flattened views that the training loop needs: ``dp`` (every data-parallel axis: ranks
that read different batches), ``dp_shard_cp`` (the ranks a model is sharded over) and ``dp_cp`` (the
ranks a loss is averaged over).

Unset sizes and backends are read from ``PARALLELISM_CONFIG_*`` environment variables (what a launcher
passes on), else 1 / the only backend.

Beyond the reference, ``dp_replicate_size``, ``dp_shard_size`` and ``tp_size`` may be ``"auto"``:
:meth:`ParallelismConfig.resolve_auto` then chooses them from the model and the machine
(:func:`accelerando.core.parallelism_layout.choose_layout`) before the mesh is built.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, TypeAlias, TypedDict

from typing_extensions import Unpack

import accelerando.core.parallelism_layout as pl
from accelerando.core.parallelism_layout import Layout, MachineShape, ModelFacts
from accelerando.core.settings import environment_text
from accelerando.plugins import parallel_configs
from accelerando.plugins.parallel_configs import (
    DeepSpeedSequenceParallelConfig,
    TorchContextParallelConfig,
    TorchTensorParallelConfig,
)

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    #: The option classes of the non-data axes.
    AxisHandler: TypeAlias = (
        TorchTensorParallelConfig | TorchContextParallelConfig | DeepSpeedSequenceParallelConfig
    )


class LayoutOptions(TypedDict, total=False):
    """The keyword options :meth:`ParallelismConfig.resolve_auto` passes to ``choose_layout``."""

    batch_size: int
    seq_length: int
    mixed_precision: str
    optimizer: str
    training: bool
    activation_checkpointing: bool
    headroom: float
    simulator: Callable[[int, int, int, int], int | None] | None


__all__ = ["ParallelismConfig"]

_AXES = ("dp_replicate", "dp_shard", "tp", "cp", "sp")
# Order of the axes in the mesh, outermost first (neighbouring ranks share the innermost axis).
_MESH_ORDER = ("dp_replicate", "dp_shard", "cp", "sp", "tp")
#: The sequence-parallel implementation (DeepSpeed Ulysses), the only ``sp_backend``.
SP_BACKEND_DEEPSPEED = "deepspeed"
_BACKENDS = {"cp": ("torch",), "sp": (SP_BACKEND_DEEPSPEED,)}
# Handler class (from accelerando.plugins.parallel_configs) created for an axis larger than 1 when none was given.
_HANDLER_CLASSES = {
    "tp": "TorchTensorParallelConfig",
    "cp": "TorchContextParallelConfig",
    "sp": "DeepSpeedSequenceParallelConfig",
}
_ENV_PREFIX = "PARALLELISM_CONFIG_"
# Axes the automatic layout chooses (a size of "auto"); the others must be numbers.
_AUTO_AXES = ("dp_replicate", "dp_shard", "tp")
_AUTO = "auto"
logger = logging.getLogger(__name__)


def _env_int(axis: str) -> int | str:
    name = f"{_ENV_PREFIX}{axis.upper()}_SIZE"
    raw = environment_text(name)
    if raw is None:
        raw = "1"
    if raw.strip().lower() == _AUTO and axis in _AUTO_AXES:
        return _AUTO
    try:
        return int(raw)
    except ValueError:
        raise ValueError(
            f"environment variable {name}={raw!r} is not an integer; set it to a size >= 1"
        ) from None


def _default_handler(axis: str) -> AxisHandler:
    """A default instance of the axis's option class (``accelerando.plugins.parallel_configs``)."""
    return getattr(parallel_configs, _HANDLER_CLASSES[axis])()


@dataclass
class ParallelismConfig:
    """Sizes of each parallelism axis (1 = not used) and the options of the non-data axes.

    Args:
        dp_replicate_size: data-parallel replicas (DDP, or the replica axis of HSDP).
        dp_shard_size: FSDP shards per replica.
        tp_size: tensor-parallel degree.
        cp_size: context-parallel degree.
        cp_backend: context-parallel implementation; only ``"torch"``.
        sp_size: sequence-parallel degree (DeepSpeed Ulysses).
        sp_backend: sequence-parallel implementation; only ``"deepspeed"``.
        tp_handler / cp_handler / sp_handler: the axis's options (``TorchTensorParallelConfig``,
            ``TorchContextParallelConfig``, ``DeepSpeedSequenceParallelConfig``); a default one is
            created for an axis larger than 1.

    Raises:
        ValueError: a size below 1, an unknown backend, tensor/context parallelism over pure
            replication (needs ``dp_shard_size > 1``), or both context and sequence parallelism;
            ``"auto"`` for cp/sp (only dp_replicate, dp_shard and tp are chosen automatically).
    """

    dp_replicate_size: int | None = None
    dp_shard_size: int | None = None
    tp_size: int | None = None
    cp_size: int | None = None
    cp_backend: Literal["torch"] | None = None
    sp_size: int | None = None
    sp_backend: Literal["deepspeed"] | None = None
    tp_handler: TorchTensorParallelConfig | None = None
    cp_handler: TorchContextParallelConfig | None = None
    sp_handler: DeepSpeedSequenceParallelConfig | None = None
    device_mesh: DeviceMesh | None = field(default=None, init=False, repr=False, compare=False)
    #: The automatic layout :meth:`resolve_auto` chose (None when the sizes were given).
    layout: Layout | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        unset = []
        for axis in _AXES:
            value = getattr(self, f"{axis}_size")
            if value is None:
                if environment_text(f"{_ENV_PREFIX}{axis.upper()}_SIZE") is None:
                    unset.append(axis)
                value = _env_int(axis)
                setattr(self, f"{axis}_size", value)
            if isinstance(value, str) and value.lower() == _AUTO and axis in _AUTO_AXES:
                setattr(self, f"{axis}_size", _AUTO)
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                auto = ' or "auto"' if axis in _AUTO_AXES else ""
                raise ValueError(
                    f"ParallelismConfig.{axis}_size must be an integer >= 1{auto}, got {value!r}"
                )
        for axis, choices in _BACKENDS.items():
            name = f"{axis}_backend"
            if getattr(self, name) is None:
                setattr(self, name, environment_text(f"{_ENV_PREFIX}{axis.upper()}_BACKEND", choices[0]))
            if getattr(self, name) not in choices:
                raise ValueError(
                    f"ParallelismConfig.{name} must be one of {list(choices)}, got {getattr(self, name)!r}"
                )
        if self.auto_axes:
            # Next to an "auto" size, the other automatic axes left unset are chosen too.
            for axis in (a for a in _AUTO_AXES if a in unset):
                setattr(self, f"{axis}_size", _AUTO)
        else:
            self._check_sizes()

    def _check_sizes(self) -> None:
        """Default handlers and the cross-axis rules, once every size is a number."""
        for axis in _HANDLER_CLASSES:
            handler = f"{axis}_handler"
            if getattr(self, f"{axis}_size") > 1 and getattr(self, handler) is None:
                setattr(self, handler, _default_handler(axis))
            elif getattr(self, f"{axis}_size") == 1 and getattr(self, handler) is not None:
                warnings.warn(
                    f"ParallelismConfig.{handler} is ignored: {axis}_size is 1 (set {axis}_size > 1 to use it)",
                    stacklevel=3,
                )
        if (self.tp_enabled or self.cp_enabled) and self.dp_replicate_enabled and not self.dp_shard_enabled:
            raise ValueError(
                "tensor or context parallelism cannot sit on pure replication (dp_replicate_size > 1 with "
                "dp_shard_size == 1): use dp_shard_size > 1 (FSDP + TP/CP), optionally with dp_replicate_size "
                "> 1 (HSDP + TP/CP)"
            )
        if self.cp_enabled and self.sp_enabled:
            raise ValueError(
                "context parallelism (cp_size) and sequence parallelism (sp_size) exclude each other; keep one"
            )

    def __repr__(self) -> str:
        sizes = ", ".join(f"{axis}_size={getattr(self, f'{axis}_size')}" for axis in _AXES)
        return f"ParallelismConfig({sizes}, cp_backend={self.cp_backend!r}, sp_backend={self.sp_backend!r})"

    # ------------------------------------------------------------------ sizes
    @property
    def _sizes(self) -> dict[str, int]:
        return {axis: getattr(self, f"{axis}_size") for axis in _AXES}

    def _size(self, axis: str) -> int:
        # The fields also take None (read the environment) and "auto" before they are resolved.
        return getattr(self, f"{axis}_size")

    @property
    def auto_axes(self) -> list[str]:
        """The axes whose size is still ``"auto"`` (empty once :meth:`resolve_auto` ran)."""
        return [axis for axis in _AXES if getattr(self, f"{axis}_size") == _AUTO]

    def _require_resolved(self) -> None:
        if self.auto_axes:
            sizes = ", ".join(f"{axis}_size='auto'" for axis in self.auto_axes)
            raise ValueError(
                f"ParallelismConfig({sizes}) is not resolved yet: call "
                "parallelism_config.resolve_auto(model, num_processes=...) before creating the Accelerator "
                "(or launch with --parallelism auto --parallelism_model <config.json>), or give the sizes"
            )

    def resolve_auto(
        self,
        model: object = None,
        *,
        num_processes: int | None = None,
        num_nodes: int = 1,
        memory_per_device: int | str | None = None,
        model_facts: ModelFacts | None = None,
        machine: MachineShape | None = None,
        **layout_options: Unpack[LayoutOptions],
    ) -> Layout:
        """Choose the ``"auto"`` sizes from the model and the machine (:func:`~accelerando.core.parallelism_layout.choose_layout`).

        Args:
            model: a ``torch.nn.Module`` or a transformers config (or ``config.json`` path); or give
                ``model_facts``.
            num_processes: processes in the job (needed unless ``machine`` is given).
            num_nodes: machines in the job (devices per node = ``num_processes // num_nodes``).
            memory_per_device: bytes (or ``"80GB"``) of one device; None = the current CUDA device's
                total memory, or without CUDA the host's RAM shared by the processes of a node.
            model_facts / machine: the facts themselves, instead of ``model`` / the arguments above.
            layout_options: passed to ``choose_layout`` (``batch_size``, ``seq_length``,
                ``mixed_precision``, ``optimizer``, ``activation_checkpointing``, ``headroom``...).

        Returns:
            The chosen :class:`~accelerando.core.parallelism_layout.Layout` (also kept as ``self.layout``);
            its reasons are logged at INFO level.

        Raises:
            ValueError: no layout fits (numbers and fixes in the message), the layout needs pipeline
                stages (no ``pp`` axis here: use ``PipelineParallelPlugin``), or it contradicts a size
                given as a number.
        """
        if model_facts is None:
            if model is None:
                raise ValueError(
                    "resolve_auto needs the model (a module or a transformers config) or model_facts"
                )
            is_module = callable(getattr(model, "parameters", None))
            model_facts = (
                pl.model_facts_from_module(model) if is_module else pl.model_facts_from_config(model)
            )
        if machine is None:
            if num_processes is None:
                raise ValueError("resolve_auto needs num_processes=... (or machine=MachineShape(...))")
            if num_processes % num_nodes:
                raise ValueError(f"{num_processes} processes do not split evenly over {num_nodes} nodes")
            per_node = num_processes // num_nodes
            memory, device_type = (
                _device_memory(per_node)
                if memory_per_device is None
                else (pl.parse_memory(memory_per_device), "cuda")
            )
            machine = pl.MachineShape(num_nodes, per_node, int(memory), device_type)
        layout = pl.choose_layout(model_facts, machine, **layout_options)
        for line in layout.reason:
            logger.info("automatic parallel layout: %s", line)
        if layout.pp > 1:
            raise ValueError(
                f"the automatic layout needs {layout.pp} pipeline stages ({layout.describe()}), and "
                "ParallelismConfig has no pipeline axis: train with PipelineParallelPlugin(pp_size=...) and "
                f"tp_size={layout.tp}, or give more memory per device / more devices"
            )
        chosen = {"dp_replicate": layout.dp_replicate, "dp_shard": layout.dp_shard, "tp": layout.tp}
        for axis in _AUTO_AXES:
            value = getattr(self, f"{axis}_size")
            if value != _AUTO and value != chosen[axis]:
                raise ValueError(
                    f"the automatic layout chose {axis}_size={chosen[axis]} ({layout.describe()}) but "
                    f"{axis}_size={value} was given; set it to 'auto' too, or give every size"
                )
        for axis in (a for a in ("cp", "sp") if getattr(self, f"{a}_size") != 1):
            raise ValueError(
                f"{axis}_size={getattr(self, f'{axis}_size')} cannot be combined with 'auto' sizes"
            )
        for axis, size in chosen.items():
            setattr(self, f"{axis}_size", size)
        self.layout = layout
        self._check_sizes()
        return layout

    @property
    def total_size(self) -> int:
        """Processes the layout needs: the product of every axis size."""
        self._require_resolved()
        return self.data_parallel_size * self.non_data_parallel_size

    @property
    def data_parallel_size(self) -> int:
        """Ranks that read different batches: ``dp_replicate_size * dp_shard_size``."""
        self._require_resolved()
        return self._size("dp_replicate") * self._size("dp_shard")

    @property
    def non_data_parallel_size(self) -> int:
        """Ranks that share one batch: ``tp_size * cp_size * sp_size``."""
        self._require_resolved()
        return self._size("tp") * self._size("cp") * self._size("sp")

    # --------------------------------------------------------------- switches
    @property
    def dp_replicate_enabled(self) -> bool:
        """Whether there are several data-parallel replicas."""
        return self._size("dp_replicate") > 1

    @property
    def dp_shard_enabled(self) -> bool:
        """Whether parameters are sharded over a dp_shard axis."""
        return self._size("dp_shard") > 1

    @property
    def dp_enabled(self) -> bool:
        """Whether gradients are averaged over several data-parallel ranks."""
        return self.dp_replicate_enabled or self.dp_shard_enabled

    @property
    def fsdp_enabled(self) -> bool:
        """Whether parameters are sharded (dp_shard or cp axis)."""
        return self.dp_shard_enabled or self.cp_enabled

    @property
    def tp_enabled(self) -> bool:
        """Whether tensor parallelism is used."""
        return self._size("tp") > 1

    @property
    def cp_enabled(self) -> bool:
        """Whether context parallelism is used."""
        return self._size("cp") > 1

    @property
    def sp_enabled(self) -> bool:
        """Whether sequence parallelism is used."""
        return self._size("sp") > 1

    # -------------------------------------------------------------- dim names
    def _enabled(self, *axes: str) -> list[str]:
        return [axis for axis in axes if self._sizes[axis] > 1]

    @property
    def dp_dim_names(self) -> list[str]:
        """The enabled data-parallel axes (ranks on them read different batches)."""
        return self._enabled("dp_replicate", "dp_shard")

    @property
    def non_dp_dim_names(self) -> list[str]:
        """The enabled axes whose ranks share one batch (tp, cp, sp)."""
        return self._enabled("tp", "cp", "sp")

    @property
    def dp_shard_cp_dim_names(self) -> list[str]:
        """The enabled axes flattened into ``dp_shard_cp``, the ranks a model is sharded over."""
        return self._enabled("dp_shard", "cp")

    @property
    def dp_cp_dim_names(self) -> list[str]:
        """The enabled axes flattened into ``dp_cp``, the ranks a loss is averaged over."""
        return self._enabled("dp_replicate", "dp_shard", "cp")

    @property
    def fsdp_dim_names(self) -> list[str]:
        """The mesh dimensions FSDP is applied over: ``dp_replicate`` (when enabled) and ``dp_shard_cp``."""
        return [*self._enabled("dp_replicate"), "dp_shard_cp"]

    @property
    def active_mesh_dims(self) -> list[str]:
        """Every enabled axis: the data-parallel ones, then tp, cp, sp."""
        return self.dp_dim_names + self.non_dp_dim_names

    # ------------------------------------------------------------- checking
    def validate(self, num_processes: int) -> None:
        """Check the layout fits ``num_processes``.

        A config with every size 1 in a job of several processes becomes plain replication
        (``dp_replicate_size = num_processes``), so the data-parallel sizes and ranks are the job's.

        Raises:
            ValueError: the product of the sizes differs from the process count (with the product shown),
                or a size is still ``"auto"`` (call :meth:`resolve_auto` first).
        """
        self._require_resolved()
        if self.total_size == 1 and num_processes > 1:
            self.dp_replicate_size = num_processes
        if self.total_size != num_processes:
            sizes = " x ".join(f"{axis}={size}" for axis, size in self._sizes.items())
            raise ValueError(
                f"ParallelismConfig needs {sizes} = {self.total_size} processes but the job has {num_processes}; "
                "change the sizes so that their product is the process count"
            )

    # ----------------------------------------------------------------- mesh
    def _get_mesh(self) -> tuple[tuple[str, ...], tuple[int, ...]] | tuple[()]:
        """``(dim names, shape)`` of the mesh over the enabled axes, outermost first; ``()`` when none is.

        The order is ``dp_replicate, dp_shard, cp, sp, tp``: neighbouring ranks share the innermost axis,
        so tensor parallelism (the chattiest) stays within a node.

        Raises:
            ValueError: a size is still ``"auto"`` (call :meth:`resolve_auto` first).
        """
        self._require_resolved()
        dims = tuple(axis for axis in _MESH_ORDER if self._sizes[axis] > 1)
        if not dims:
            return ()
        return dims, tuple(self._sizes[axis] for axis in dims)

    def build_device_mesh(self, device_type: str) -> DeviceMesh | None:
        """Create the ``DeviceMesh`` of the enabled axes (None when no axis is larger than 1).

        The mesh also holds the flattened dimensions ``dp``, ``dp_shard_cp`` and ``dp_cp`` when their
        axes are enabled. The sizes are not checked against the job here (the mesh can be planned before
        the processes exist): :meth:`validate` does that, and the connector calls it first.

        Raises:
            ValueError: a size is still ``"auto"``.
        """
        mesh_layout = self._get_mesh()
        if not mesh_layout:
            return None
        from torch.distributed.device_mesh import init_device_mesh

        dims, shape = mesh_layout
        mesh = init_device_mesh(device_type, shape, mesh_dim_names=dims)
        for flat, names in (
            ("dp", self.dp_dim_names),
            ("dp_shard_cp", self.dp_shard_cp_dim_names),
            ("dp_cp", self.dp_cp_dim_names),
        ):
            if names:
                # torch types the index as str | tuple[str, ...]; the reference passes the list, as here.
                # torch 2.13: torch/distributed/device_mesh.py:1268 (private; the reference flattens the same way)
                mesh[names]._flatten(flat)  # pyright: ignore[reportArgumentType]
        return mesh

    def get_device_mesh(self, device_type: str | None = None) -> DeviceMesh | None:
        """The config's ``DeviceMesh``, built on first use for ``device_type``.

        Raises:
            ValueError: no mesh exists yet and no ``device_type`` was given, or the mesh exists on
                another device type.
        """
        if self.device_mesh is None:
            if device_type is None:
                raise ValueError(
                    'no device mesh has been built yet: pass a device type, e.g. get_device_mesh("cuda")'
                )
            self.device_mesh = self.build_device_mesh(device_type)
        elif device_type is not None and self.device_mesh.device_type != device_type:
            raise ValueError(
                f"the device mesh is on {self.device_mesh.device_type!r}, not {device_type!r}; call "
                "get_device_mesh() without a device type"
            )
        return self.device_mesh

    # --------------------------------------------------------------- export
    def to_json(self) -> dict[str, object]:
        """The config as a JSON-serialisable dict (handlers as dicts of their fields; no mesh)."""
        out: dict[str, object] = {}
        for item in dataclasses.fields(self):
            if not item.init:
                continue
            value = getattr(self, item.name)
            if dataclasses.is_dataclass(value) and not isinstance(value, type):
                value = dataclasses.asdict(value)
            elif hasattr(value, "__dict__"):
                value = dict(vars(value))
            out[item.name] = copy.deepcopy(value)
        return out


def _device_memory(per_node: int) -> tuple[int, str]:
    """``(bytes, device type)`` of one device: the current CUDA device's memory, else RAM per process."""
    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory, "cuda"
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return ram // max(per_node, 1), "cpu"
