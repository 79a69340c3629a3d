"""The table of every setting accelerando resolves.

Each :class:`Field` row says, for one setting: its type and default, the environment variables it is
read from (ours first, then the reference project's names for scripts migrated from it), where it
lives in a config file, which launcher flag sets it, and which values it allows. The resolver, the
config-file validator, the launcher's argparse options and its environment export are all generated
from this one table, so a new setting is one new row.

This module must stay importable without torch: the command line uses it before any process starts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, TypedDict

from accelerando.core.enums import DistributedType, DynamoBackend, PrecisionType

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["Field", "FIELDS", "FIELDS_BY_NAME", "GROUPS", "get_field", "fields_in_group", "quote_value"]

#: Prefix of the environment variables the launcher writes and every process reads first.
ENV_PREFIX = "ACCELERANDO_"

_KINDS = ("str", "int", "float", "bool", "choice", "list")

#: Longest part of a bad value an error message quotes (a 50 MB value must not fill the terminal).
QUOTE_LIMIT = 40


def quote_value(value: object, limit: int = QUOTE_LIMIT) -> str:
    """Quote a value for an error message, cut to ``limit`` characters.

    Args:
        value: any value; strings are cut before quoting, other values after ``repr``.
        limit: the most characters of the value to show.

    Returns:
        ``repr(value)`` when short, else the first ``limit`` characters quoted, then
        ``"... (N characters)"`` with the full length.

    Example:
        >>> quote_value("x" * 100, limit=3)
        "'xxx'... (100 characters)"
    """
    if isinstance(value, str):
        return repr(value) if len(value) <= limit else f"{value[:limit]!r}... ({len(value)} characters)"
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


@dataclasses.dataclass(frozen=True, slots=True)
class Field:
    """One setting: its type, default and every place it can come from.

    Attributes:
        name: attribute name on :class:`~accelerando.core.settings.Settings`.
        kind: one of ``"str"``, ``"int"``, ``"float"``, ``"bool"``, ``"choice"``, ``"list"``.
        default: value when no layer sets it (``None`` = "not given; detect at run time").
        group: ``"core"``, ``"launch"``, ``"dynamo"``, ``"fsdp"``, ``"deepspeed"``, ``"megatron"``.
        help: one line shown by ``--help`` and ``accelerando env``.
        choices: allowed values of a ``"choice"`` field, in canonical spelling.
        aliases: extra spellings of choices (e.g. the reference's numeric FSDP strategies).
        minimum: smallest allowed value of an ``"int"``/``"float"`` field.
        maximum: largest allowed value of an ``"int"``/``"float"`` field.
        env: the reference project's environment variable names, read after ours.
        config_keys: dotted paths in a config file; the first is where the field is written.
        cli: the launcher flag, or ``None`` when the field has none.
        switch: the flag takes no value (``--cpu``), otherwise it takes one (``--zero_stage 2``).
        export: the launcher carries the resolved value to the processes.
        our_env: our environment variable name (``ACCELERANDO_<NAME>`` unless given).
        in_config: whether a config file may set it (False: environment or code only).
        ref_bool: how the reference's launcher spells true and false in its variable (``env[0]``);
            the launcher writes the same text so scripts comparing strings keep working.
        parser: reads this field's text values (environment, flag, quoted config value) in place of
            the kind's own reading: text -> value, raising ``ValueError`` whose message says what is
            wrong with the text (the resolver adds the setting, its source and the fix). A number it
            returns is still held to ``minimum``/``maximum``; typed values (an int from code or
            YAML) are read by the kind as usual. ``None``: the kind reads text too.
        parser_accepts: what ``parser`` reads besides the kind's own values, as shown in messages
            and help (``"'MIN:MAX'"``); only with a ``parser``.
    """

    name: str
    kind: str
    default: object = None
    group: str = "core"
    help: str = ""
    choices: tuple[str, ...] | None = None
    aliases: dict[str, str] = dataclasses.field(default_factory=dict)
    minimum: float | None = None
    maximum: float | None = None
    env: tuple[str, ...] = ()
    config_keys: tuple[str, ...] = ()
    cli: str | None = None
    switch: bool = False
    export: bool = True
    our_env: str = ""
    ref_bool: tuple[str, str] = ("true", "false")
    in_config: bool = True
    parser: Callable[[str], object] | None = None
    parser_accepts: str = ""

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise ValueError(f"Field {self.name!r}: kind {self.kind!r} is not one of {_KINDS}.")
        if self.parser_accepts and self.parser is None:
            raise ValueError(f"Field {self.name!r}: parser_accepts describes a parser; give the parser too.")
        if not self.our_env:
            object.__setattr__(self, "our_env", ENV_PREFIX + self.name.upper())
        if not self.in_config:
            object.__setattr__(self, "config_keys", ())
        elif not self.config_keys:
            object.__setattr__(self, "config_keys", (self.name,))

    @property
    def reference_env(self) -> str | None:
        """The reference project's variable for this setting (the one its launcher writes), if any."""
        return self.env[0] if self.env else None

    @property
    def env_names(self) -> tuple[str, ...]:
        """All environment variable names, in reading order (ours first)."""
        return (self.our_env, *self.env)

    def describe_allowed(self) -> str:
        """Human-readable description of the values this field accepts."""
        text = self._describe_kind()
        return f"{text} or {self.parser_accepts}" if self.parser_accepts else text

    def _describe_kind(self) -> str:
        if self.kind == "choice":
            return "one of " + ", ".join(repr(c) for c in self.choices or ())
        if self.kind == "bool":
            return "a boolean (true/false, yes/no, 1/0)"
        if self.kind in ("int", "float"):
            noun = "an integer" if self.kind == "int" else "a number"
            extra = "".join(f" or {c!r}" for c in self.choices or ())
            low, high = self.minimum, self.maximum
            if low is not None and high is not None:
                bounds = f" from {low:g} to {high:g}"
            elif low is not None:
                bounds = f" >= {low:g}"
            else:
                bounds = f" <= {high:g}" if high is not None else ""
            return noun + bounds + extra
        if self.kind == "list":
            return "a comma-separated list of names"
        return "a string"


def _is_machine_range(text: str) -> bool:
    """Two integers joined by one colon, spaces allowed around each (the launch plan checks the numbers)."""
    parts = text.split(":")
    return len(parts) == 2 and all(part.strip().removeprefix("-").isdecimal() for part in parts)


def parse_num_machines(text: str) -> int | str:
    """Read ``num_machines`` from text: a machine count, or ``MIN:MAX`` for an elastic range.

    Only the shape of a range is checked here; :func:`machine_range` reads its numbers and the launch
    plan checks them (MIN <= MAX, MIN >= 1) with messages naming the setting's source.

    Args:
        text: the value as written (``"2"``, ``"1:4"``, ``" 2 : 4 "``).

    Returns:
        An ``int`` for a count (the resolver then checks it is at least 1); the range's text without
        surrounding spaces (``"2 : 4"``) for a range, which launchers read with :func:`machine_range`.

    Raises:
        ValueError: the text is neither an integer nor two integers joined by a colon.
    """
    stripped = text.strip()
    if _is_machine_range(stripped):
        return stripped
    try:
        return int(stripped)
    except ValueError:
        reason = (
            "a range needs two whole numbers joined by one colon" if ":" in stripped else "not a whole number"
        )
        raise ValueError(reason) from None


def machine_range(value: int | str | None) -> tuple[int, int]:
    """The smallest and largest machine count a resolved ``num_machines`` allows.

    Args:
        value: ``settings.num_machines``: ``None`` (not given: one machine), an integer (a fixed
            count), or ``"MIN:MAX"`` text (an elastic range, as ``torchrun --nnodes MIN:MAX``).

    Returns:
        ``(MIN, MAX)``; ``(n, n)`` for a fixed count. The order is not checked (the launch plan does).

    Raises:
        ValueError: ``value`` is neither an integer nor ``MIN:MAX`` text of two integers.
    """
    if value is None:
        return 1, 1
    if isinstance(value, int) and not isinstance(value, bool):
        return value, value
    if isinstance(value, str) and _is_machine_range(value):
        low, high = value.split(":")
        return int(low), int(high)
    if isinstance(value, str) and value.strip().isdigit():
        return int(value), int(value)
    raise ValueError(
        f"num_machines={quote_value(value)} is neither a machine count nor MIN:MAX. "
        "Fix: pass an integer (--num_machines 2) or two integers joined by a colon (--num_machines 1:4)."
    )


# Only the type checker reads these (``Unpack`` in the helpers' signatures): a TypedDict built at run
# time compiles each of its annotations, which the first Accelerator would pay for nothing.
if TYPE_CHECKING:

    class _Shape(TypedDict, total=False):
        """:class:`Field` attributes about the values, which every helper below passes through."""

        choices: tuple[str, ...] | None
        aliases: dict[str, str]
        minimum: float | None
        maximum: float | None
        switch: bool
        export: bool

    class _Described(_Shape, total=False):
        """:class:`_Shape` plus the help text (for helpers that leave it to the row)."""

        help: str

    class _DeepSpeedOptions(_Described, total=False):
        """What a DeepSpeed row may give :func:`_ds` (its config keys default to the ``deepspeed_config`` one)."""

        config_keys: tuple[str, ...]

    class _Placed(_Described, total=False):
        """:class:`_Described` plus where the value is read from (for helpers that only fix the group)."""

        env: tuple[str, ...]
        config_keys: tuple[str, ...]
        cli: str | None
        our_env: str
        ref_bool: tuple[str, str]
        in_config: bool
        parser: Callable[[str], object] | None
        parser_accepts: str

    class _Options(_Placed, total=False):
        """Every :class:`Field` attribute after name, kind and default (for :func:`_core`)."""

        group: str


def _core(name: str, kind: str, default: object = None, **kw: Unpack[_Options]) -> Field:
    kw.setdefault("cli", "--" + name)
    return Field(name, kind, default, **kw)


def _fsdp(
    name: str, kind: str, default: object = None, *, ref_env: str = "", **kw: Unpack[_Described]
) -> Field:
    env = (ref_env or name.upper(),)
    return Field(
        name,
        kind,
        default,
        group="fsdp",
        env=env,
        config_keys=("fsdp_config." + name,),
        cli="--" + name,
        **kw,
    )


def _ds(
    name: str, kind: str, default: object = None, *, ref_env: str = "", **kw: Unpack[_DeepSpeedOptions]
) -> Field:
    bare = name.removeprefix("deepspeed_")
    env = (ref_env or "ACCELERATE_DEEPSPEED_" + bare.upper(),)
    kw.setdefault("config_keys", ("deepspeed_config." + name,))
    return Field(
        name,
        kind,
        default,
        group="deepspeed",
        env=env,
        cli="--" + name,
        our_env=ENV_PREFIX + "DEEPSPEED_" + bare.upper(),
        **kw,
    )


def _megatron(name: str, kind: str, help: str, minimum: float | None = None) -> Field:
    return Field(
        name,
        kind,
        None,
        group="megatron",
        help=help,
        env=(name.upper(),),  # the reference's MEGATRON_LM_<NAME>
        config_keys=("megatron_lm_config." + name,),
        cli="--" + name,
        minimum=minimum,
    )


def _parallel(axis: str, kind: str, help: str, **kw: Unpack[_Shape]) -> Field:
    name = "parallelism_config_" + axis
    kw.setdefault("minimum", 1 if kind == "int" else None)
    return Field(
        name,
        kind,
        None,
        group="parallelism",
        help=help,
        env=(name.upper(),),  # PARALLELISM_CONFIG_<AXIS>, which ParallelismConfig reads
        config_keys=("parallelism_config." + name, "parallelism_config." + axis),
        cli="--" + name,
        **kw,
    )


def _fp8(name: str, kind: str, help: str, *, keys: tuple[str, ...] = (), **kw: Unpack[_Shape]) -> Field:
    bare = name.removeprefix("fp8_")
    return Field(
        name,
        kind,
        None,
        group="fp8",
        help=help,
        env=("ACCELERATE_" + name.upper(),),
        config_keys=tuple(dict.fromkeys((*keys, "fp8_config." + bare, "fp8_config." + name))),
        cli="--" + name,
        **kw,
    )


def _ft(name: str, kind: str, default: object = None, **kw: Unpack[_Placed]) -> Field:
    """A fault-tolerance setting: ``--<name>``, ``ACCELERANDO_<NAME>``, config key ``fault_tolerance_config.<name>``."""
    kw.setdefault("cli", "--" + name)
    kw.setdefault("config_keys", ("fault_tolerance_config." + name,))
    return Field(name, kind, default, group="fault_tolerance", **kw)


def _reference_only(
    name: str, kind: str, env: str, help: str, *, default: object = None, **kw: Unpack[_Shape]
) -> Field:
    """A setting the reference reads from its environment only (no flag, no config key)."""
    return Field(name, kind, default, env=(env,), cli=None, in_config=False, help=help, **kw)


def _dynamo(name: str, kind: str, default: object, help: str, **kw: Unpack[_Shape]) -> Field:
    return Field(
        name,
        kind,
        default,
        group="dynamo",
        help=help,
        env=("ACCELERATE_" + name.upper(),),
        config_keys=("dynamo_config." + name,),
        cli="--" + name,
        ref_bool=("True", "False"),
        **kw,
    )


_SHARDING = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2")
_OFFLOAD = ("none", "cpu", "nvme", "auto")

# fmt: off
FIELDS: tuple[Field, ...] = (
    # --- core: read by every process -------------------------------------------------------------
    _core("mixed_precision", "choice", "no",
          help="Numeric precision of the training step: no (float32), bf16, fp16 (with loss scaling) or "
               "fp8. Each runs on CPU and GPU; where the hardware only emulates it (fp16 and fp8 on most "
               "CPUs, bf16 on CPUs without bf16 kernels or GPUs before Ampere) it is slower than float32 "
               "and the run warns once.",
          choices=tuple(PrecisionType.list()), env=("ACCELERATE_MIXED_PRECISION",)),
    _core("gradient_accumulation_steps", "int", 1, minimum=1,
          help="Number of batches whose gradients are summed before an optimizer step.",
          env=("ACCELERATE_GRADIENT_ACCUMULATION_STEPS",),
          config_keys=("gradient_accumulation_steps", "deepspeed_config.gradient_accumulation_steps")),
    _core("cpu", "bool", False, switch=True, help="Run on CPU even when an accelerator is present.",
          env=("ACCELERATE_USE_CPU",), config_keys=("use_cpu",), our_env="ACCELERANDO_USE_CPU",
          ref_bool=("True", "False")),
    _core("distributed_type", "choice", None, choices=tuple(DistributedType.list()),
          help="Distributed mode requested by the launcher or config (unset = detect)."),
    _core("use_deepspeed", "bool", False, switch=True, help="Use the DeepSpeed backend.",
          env=("ACCELERATE_USE_DEEPSPEED",)),
    _core("use_fsdp", "bool", False, switch=True, help="Use Fully Sharded Data Parallel.",
          env=("ACCELERATE_USE_FSDP",)),
    _core("use_megatron_lm", "bool", False, switch=True, help="Use the Megatron-LM backend.",
          env=("ACCELERATE_USE_MEGATRON_LM",)),
    _core("debug", "bool", False, switch=True,
          help="Check that collective operations get the same shapes on every process.",
          env=("ACCELERATE_DEBUG_MODE",)),
    _core("downcast_bf16", "bool", False, switch=True, help="On TPUs, store float32 tensors as bfloat16.",
          env=("ACCELERATE_DOWNCAST_BF16",)),
    _core("log_level", "str", None, cli=None, help="Log level of accelerando's loggers.",
          env=("ACCELERATE_LOG_LEVEL",)),
    _core("verify_checksums", "bool", True, cli=None,
          help="load_state compares every file it reads with the checkpoint's checksums (sizes always)."),
    _core("checkpoint_lock_wait", "float", None, cli=None, minimum=0,
          help="Seconds save_state waits for another run's lock on the project folder (unset: refuse at once)."),
    _core("checkpoint_durable", "bool", True,
          help="save_state flushes every file and rename to disk (fsync) before returning; false: scratch "
               "checkpoints, still atomic against a crashed process but not against power loss."),
    _core("log_checkpoint_metrics", "bool", False, switch=True,
          help="save_state logs accelerando/checkpoint_size_bytes to the trackers at the step of the script's "
               "last accelerator.log call (never accelerator.step); off: save_state logs nothing to them."),
    _core("auto_resume", "bool", False, switch=True,
          help="The first prepare() loads the newest complete checkpoint of the project folder (automatic "
               "checkpoint naming) and the prepared dataloaders skip to their saved position; implies "
               "preemption_checkpoint."),
    _core("elastic_batch", "choice", "keep_accumulation", choices=("keep_accumulation", "keep_global"),
          help="When load_state resumes on another number of processes: keep_accumulation keeps "
               "gradient_accumulation_steps (the batch per optimizer step changes with the processes); "
               "keep_global changes it so the batch per optimizer step stays the saved one, where it divides."),
    _core("preemption_checkpoint", "bool", False, switch=True,
          help="On SIGTERM/SIGUSR1 the training finishes its step, saves a checkpoint and exits with "
               "status 143 (the launcher then exits 143 too, so the scheduler requeues the job)."),
    _core("install_as_accelerate", "bool", False, switch=True,
          help="Every launched process calls accelerando.install_as_accelerate() before the script runs, "
               "so `import accelerate` (in the script, transformers, peft...) gets accelerando."),
    _core("use_parallelism_config", "bool", False, switch=True, env=("ACCELERATE_USE_PARALLELISM_CONFIG",),
          help="Lay the processes out on an N-d mesh from the --parallelism_config_* sizes."),
    # --- read from the reference's environment variables only (no flag, no config key) -----------
    _reference_only("init_include_buffers", "bool", "ACCELERATE_INIT_INCLUDE_BUFFERS",
                    "init_empty_weights() also puts buffers on the meta device when include_buffers is "
                    "not given.", default=False),
    _reference_only("torch_device", "str", "ACCELERATE_TORCH_DEVICE",
                    "The torch device each process uses instead of the detected one (e.g. 'cuda:1')."),
    _reference_only("bypass_device_map", "bool", "ACCELERATE_BYPASS_DEVICE_MAP",
                    "Allow prepare() on a model dispatched with a device_map in a distributed run.",
                    default=False),
    _reference_only("allow_cp_standalone", "bool", "ACCELERATE_ALLOW_CP_STANDALONE",
                    "Allow context parallelism without FSDP sharding.", default=False),
    _reference_only("enable_rich", "bool", "ACCELERATE_ENABLE_RICH",
                    "Pretty tracebacks with the rich package.", default=False),
    _reference_only("debug_rdv_file", "str", "ACCELERATE_DEBUG_RDV_FILE",
                    "File used as the rendezvous (file:// init method) of a debug launch."),
    _reference_only("in_tpu_pod", "bool", "ACCELERATE_IN_TPU_POD",
                    "The process runs on a TPU pod (not supported here).", default=False),
    _reference_only("use_sagemaker", "bool", "ACCELERATE_USE_SAGEMAKER",
                    "The process runs in an Amazon SageMaker job (not supported here).", default=False),
    _reference_only("sagemaker_distributed_type", "str", "ACCELERATE_SAGEMAKER_DISTRIBUTED_TYPE",
                    "SageMaker's distributed mode (not supported here)."),
    _reference_only("config_ds_fields", "list", "ACCELERATE_CONFIG_DS_FIELDS",
                    "DeepSpeed keys the launcher took from a config file (they must not also be in a "
                    "DeepSpeed JSON config)."),
    # --- launch topology: written by the launcher, informational inside a process ---------------
    _core("num_processes", "int", None, group="launch", minimum=1,
          help="Total number of processes to start (all machines).", env=("ACCELERATE_NUM_PROCESSES",)),
    _core("num_machines", "int", None, group="launch", minimum=1,
          parser=parse_num_machines, parser_accepts="'MIN:MAX'",
          help="Number of machines, or MIN:MAX for an elastic job that runs with MIN to MAX machines "
               "(c10d rendezvous; quote it in YAML: \"1:4\")."),
    _core("machine_rank", "int", None, group="launch", minimum=0, help="Rank of this machine (0-based)."),
    _core("gpu_ids", "str", None, group="launch",
          help="GPUs to use on this machine: 'all' or a comma-separated list of ids."),
    _core("multi_gpu", "bool", False, group="launch", switch=True, config_keys=("multi_gpu",),
          help="Start one process per GPU with distributed data parallel."),
    _core("main_process_ip", "str", None, group="launch", help="Address of the machine of rank 0."),
    _core("bind_address", "str", None, group="launch",
          help="Address the job's listeners bind (rendezvous store, torchft lighthouse, managers and checkpoint "
               "servers); unset: --main_process_ip, or 127.0.0.1 (this machine only) on one machine. "
               "0.0.0.0 or :: binds every interface."),
    _core("main_process_port", "int", None, group="launch", minimum=0, maximum=65535,
          help="Port of the machine of rank 0 (0 or unset: a free port on one machine, 29500 on several)."),
    _core("same_network", "bool", True, group="launch", switch=True,
          help="All machines are on the same local network."),
    _core("num_cpu_threads_per_process", "int", None, group="launch", minimum=1,
          help="OMP_NUM_THREADS for each process."),
    _core("enable_cpu_affinity", "bool", False, group="launch", switch=True,
          help="Pin each process to the CPU cores closest to its GPU.", env=("ACCELERATE_CPU_AFFINITY",),
          ref_bool=("1", "0")),
    _core("main_training_function", "str", "main", group="launch", cli=None,
          help="Name of the function a notebook or TPU launch calls."),
    _core("rdzv_backend", "str", "static", group="launch", help="Rendezvous backend (static, c10d, etcd)."),
    _core("rdzv_conf", "str", None, group="launch", help="Extra rendezvous settings: key1=value1,key2=value2."),
    _core("max_restarts", "int", 0, group="launch", minimum=0, help="Restarts allowed before failing."),
    _core("monitor_interval", "float", 0.1, group="launch", minimum=0,
          help="Seconds between checks of the processes' state."),
    _core("rdzv_last_call_timeout", "int", 5, group="launch", minimum=0,
          help="Seconds a dynamic rendezvous (c10d) of a --num_machines MIN:MAX range waits for more machines "
               "once MIN joined, at the start and when the machines left after a loss meet again "
               "(torchrun's last_call_timeout, 30 there)."),
    _core("rdzv_peer_timeout", "int", 15, group="launch", minimum=2,
          help="Seconds a machine of a dynamic rendezvous (c10d) may miss its keep-alives before the others "
               "drop it and restart without it (also when its processes hang, e.g. a cut link); sets "
               "torchrun's keep_alive_interval x keep_alive_max_attempt."),
    _core("hang_timeout", "float", 1200.0, group="launch", minimum=0,
          help="Seconds a collective may wait for its peers (or the job sit idle) before the launcher stops "
               "the job and names the processes that did not arrive; 0 disables."),
    # --- fault tolerance (torchft): replica groups that train on while one of them restarts ---------
    _ft("fault_tolerance", "bool", False, switch=True,
        help="Per-step fault tolerance with torchft: the launch starts --ft_replica_groups copies of the job "
             "(each of --num_processes processes) coordinated by a lighthouse; a group that fails restarts "
             "(up to --max_restarts) and recovers its weights from a live group while the others keep "
             "training. Needs the torchft extra."),
    _ft("ft_lighthouse", "str", None, env=("TORCHFT_LIGHTHOUSE",),
        help="Address of a running torchft lighthouse (http://host:port); unset: the launch starts one "
             "on this machine."),
    _ft("ft_replica_groups", "int", None, minimum=1,
        help="Replica groups the launch starts on this machine (default 2)."),
    _ft("ft_min_replicas", "int", None, minimum=1,
        help="Replica groups that must take part in a step for it to be committed (default 1)."),
    _ft("ft_timeout", "float", None, minimum=0,
        help="Seconds a fault-tolerant all-reduce, commit or weight transfer may wait (default 60)."),
    _ft("ft_heartbeat_timeout", "float", None, minimum=0,
        help="Seconds without a heartbeat after which the lighthouse drops a replica group (default 5)."),
    _ft("ft_insecure", "bool", False, switch=True,
        help="Let torchft's servers (lighthouse, managers, checkpoint servers) listen on an address other "
             "machines reach: they have no authentication, so anyone who reaches them can join, stall or "
             "stop the job and read its weights."),
    _ft("ft_replica_id", "int", None, minimum=0, cli=None, in_config=False,
        help="This process's replica group (written by the launch for each group)."),
    # --- job files: `accelerando launch --emit slurm|kubernetes` writes a job instead of starting one ---
    _core("emit", "choice", None, group="emit", choices=("slurm", "kubernetes", "ray"), export=False,
          in_config=False,
          help="Write a job for a cluster scheduler from these settings instead of launching: an sbatch "
               "script (slurm), a Kubeflow PyTorchJob manifest (kubernetes) or a Ray job's entrypoint "
               "script (ray, submitted with `ray job submit`)."),
    _core("emit_to", "str", None, group="emit", export=False, in_config=False,
          help="File to write the --emit job to (default: print it)."),
    _core("emit_image", "str", None, group="emit", export=False, in_config=False,
          help="Container image of an --emit kubernetes job; it must have accelerando and the script."),
    # --- Ray: `accelerando launch --ray [ADDRESS]` runs the processes as workers of a Ray cluster ----
    _core("ray", "str", None, group="ray", export=False,
          help="Run the processes as workers on a Ray cluster: ADDRESS (host:port, ray://host:port, 'auto': "
               "a running cluster, 'local': a new one), or alone ('default') for ray.init()'s own choice: "
               "RAY_ADDRESS, else the cluster last started on this machine, else a new local one."),
    # --- torch.compile ----------------------------------------------------------------------------
    _dynamo("dynamo_backend", "choice", "NO", "Backend passed to torch.compile ('no' = do not compile).",
            choices=tuple(DynamoBackend.list())),
    _dynamo("dynamo_mode", "choice", None, "torch.compile mode.",
            choices=("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")),
    _dynamo("dynamo_use_fullgraph", "bool", False, "Compile the whole model as one graph.", switch=True),
    _dynamo("dynamo_use_dynamic", "bool", False, "Compile with dynamic shapes.", switch=True),
    _dynamo("dynamo_use_regional_compilation", "bool", False, "Compile repeated blocks once.", switch=True),
    # --- FSDP -------------------------------------------------------------------------------------
    _fsdp("fsdp_version", "choice", None, choices=("1", "2"), help="FSDP implementation version."),
    _fsdp("fsdp_sharding_strategy", "choice", None, choices=(*_SHARDING, "AUTO"),
          aliases={str(i + 1): s for i, s in enumerate(_SHARDING)},
          help="How FSDP shards state (AUTO: the least sharding that fits, decided at prepare)."),
    _fsdp("fsdp_reshard_after_forward", "str", None,
          help="FSDP2: true/false; FSDP1: a sharding strategy name."),
    _fsdp("fsdp_auto_wrap_policy", "choice", None, ref_env="FSDP_AUTO_WRAP_POLICY",
          choices=("TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP"), help="Which submodules to wrap."),
    _fsdp("fsdp_transformer_layer_cls_to_wrap", "list", None, ref_env="FSDP_TRANSFORMER_CLS_TO_WRAP",
          help="Layer class names to wrap (comma-separated)."),
    _fsdp("fsdp_min_num_params", "int", None, minimum=0, help="Minimum parameters for size-based wrapping."),
    _fsdp("fsdp_backward_prefetch", "choice", None,
          choices=("BACKWARD_PRE", "BACKWARD_POST", "NO_PREFETCH"), help="Backward prefetch policy."),
    _fsdp("fsdp_forward_prefetch", "bool", None, help="Prefetch the next all-gather in forward."),
    _fsdp("fsdp_offload_params", "bool", None, help="Offload parameters and gradients to CPU."),
    _fsdp("fsdp_state_dict_type", "choice", None,
          choices=("FULL_STATE_DICT", "LOCAL_STATE_DICT", "SHARDED_STATE_DICT"), help="Checkpoint layout."),
    _fsdp("fsdp_cpu_ram_efficient_loading", "bool", None, help="Load weights on rank 0 only."),
    _fsdp("fsdp_sync_module_states", "bool", None, help="Broadcast rank 0's weights at wrap time."),
    _fsdp("fsdp_use_orig_params", "bool", None, help="Keep original parameters visible to the optimizer."),
    _fsdp("fsdp_activation_checkpointing", "bool", None, help="Recompute activations in backward."),
    _fsdp("fsdp_activation_checkpointing_offload", "bool", None,
          help="With activation checkpointing, keep the saved activations in CPU memory."),
    _fsdp("fsdp_ignored_modules", "str", None,
          help="Regular expression over module names: matching modules are left unsharded."),
    # --- DeepSpeed --------------------------------------------------------------------------------
    _ds("deepspeed_config_file", "str", None, help="Path to a DeepSpeed JSON config."),
    _ds("zero_stage", "int", None, minimum=0, choices=("auto",), ref_env="ACCELERATE_DEEPSPEED_ZERO_STAGE",
        help="ZeRO stage 0-3, or auto (the lowest stage that fits, decided at prepare)."),
    _ds("gradient_clipping", "float", None, minimum=0, ref_env="ACCELERATE_GRADIENT_CLIPPING",
        help="Gradient norm clipping value."),
    _ds("offload_optimizer_device", "choice", None, choices=_OFFLOAD, help="Where ZeRO offloads optimizer state."),
    _ds("offload_param_device", "choice", None, choices=_OFFLOAD, help="Where ZeRO-3 offloads parameters."),
    _ds("offload_optimizer_nvme_path", "str", None, help="NVMe path for optimizer offload."),
    _ds("offload_param_nvme_path", "str", None, help="NVMe path for parameter offload."),
    _ds("zero3_init_flag", "bool", None, ref_env="ACCELERATE_DEEPSPEED_ZERO3_INIT",
        help="Build models directly sharded under ZeRO-3."),
    _ds("zero3_save_16bit_model", "bool", None, help="Save a consolidated 16-bit model under ZeRO-3."),
    _ds("deepspeed_moe_layer_cls_names", "list", None, help="Mixture-of-experts layer class names."),
    _ds("deepspeed_hostfile", "str", None, export=False, help="DeepSpeed hostfile for multi-node launch."),
    _ds("deepspeed_multinode_launcher", "choice", None, export=False,
        choices=("pdsh", "standard", "openmpi", "mvapich", "mpich", "slurm", "nossh", "impi"),
        help="How DeepSpeed starts the other machines (standard: torchrun on each machine)."),
    _ds("deepspeed_inclusion_filter", "str", None, export=False,
        help="DeepSpeed runner --include: hosts/GPUs to use (e.g. worker-0@worker-1:0,2)."),
    _ds("deepspeed_exclusion_filter", "str", None, export=False,
        help="DeepSpeed runner --exclude: hosts/GPUs to leave out."),
    # --- Megatron-LM ------------------------------------------------------------------------------
    _megatron("megatron_lm_tp_degree", "int", "Tensor parallel degree.", minimum=1),
    _megatron("megatron_lm_pp_degree", "int", "Pipeline parallel degree.", minimum=1),
    _megatron("megatron_lm_num_micro_batches", "int", "Micro-batches per pipeline step.", minimum=1),
    _megatron("megatron_lm_sequence_parallelism", "bool", "Enable sequence parallelism."),
    _megatron("megatron_lm_recompute_activations", "bool", "Recompute activations."),
    _megatron("megatron_lm_use_distributed_optimizer", "bool", "Shard optimizer state."),
    _megatron("megatron_lm_gradient_clipping", "float", "Gradient clipping value (0 = off).", minimum=0),
    _megatron("megatron_lm_use_custom_fsdp", "bool", "Use Megatron's own FSDP."),
    _megatron("megatron_lm_no_load_optim", "bool", "Do not load the optimizer state from checkpoints."),
    _megatron("megatron_lm_eod_mask_loss", "bool", "Mask the loss at end-of-document tokens."),
    _megatron("megatron_lm_overlap_cpu_optimizer_d2h_h2d", "bool", "Overlap CPU-optimizer copies."),
    _megatron("megatron_lm_no_save_optim", "bool", "Do not save the optimizer state in checkpoints."),
    _megatron("megatron_lm_optimizer_cpu_offload", "bool", "Keep the optimizer on the CPU."),
    _megatron("megatron_lm_use_precision_aware_optimizer", "bool", "Use the precision-aware optimizer."),
    _megatron("megatron_lm_decoder_last_pipeline_num_layers", "int", "Layers of the last pipeline stage.",
              minimum=1),
    _megatron("megatron_lm_recompute_granularity", "str", "Recompute granularity (full, selective)."),
    _megatron("megatron_lm_recompute_method", "str", "Recompute method (uniform, block)."),
    _megatron("megatron_lm_recompute_num_layers", "int", "Layers recomputed per group.", minimum=1),
    _megatron("megatron_lm_attention_backend", "str", "Attention implementation Megatron uses."),
    _megatron("megatron_lm_expert_model_parallel_size", "int", "Expert parallel degree.", minimum=1),
    _megatron("megatron_lm_context_parallel_size", "int", "Context parallel degree.", minimum=1),
    _megatron("megatron_lm_attention_dropout", "float", "Attention dropout probability.", minimum=0),
    _megatron("megatron_lm_hidden_dropout", "float", "Hidden-state dropout probability.", minimum=0),
    _megatron("megatron_lm_attention_softmax_in_fp32", "bool", "Compute attention softmax in fp32."),
    _megatron("megatron_lm_expert_tensor_parallel_size", "int", "Expert tensor parallel degree.", minimum=1),
    _megatron("megatron_lm_calculate_per_token_loss", "bool", "Average the loss per token."),
    _megatron("megatron_lm_use_rotary_position_embeddings", "bool", "Use rotary position embeddings."),
    # --- N-d parallelism (ParallelismConfig) ------------------------------------------------------
    _parallel("dp_replicate_size", "int", "Data-parallel replicas (1 = none)."),
    _parallel("dp_shard_size", "int", "FSDP shards per replica (1 = none)."),
    _parallel("tp_size", "int", "Tensor-parallel degree (1 = none)."),
    _parallel("cp_size", "int", "Context-parallel degree (1 = none)."),
    _parallel("cp_backend", "choice", "Context-parallel implementation.", choices=("torch",)),
    _parallel("cp_comm_strategy", "choice", "Context-parallel communication.", choices=("allgather", "alltoall")),
    _parallel("sp_size", "int", "Sequence-parallel degree (1 = none)."),
    _parallel("sp_backend", "choice", "Sequence-parallel implementation.", choices=("deepspeed",)),
    _parallel("sp_seq_length", "int", "Sequence length when every batch has the same one."),
    _parallel("sp_seq_length_is_variable", "bool", "Batches may have different sequence lengths."),
    _parallel("sp_attn_implementation", "str", "Attention used with sequence parallelism (e.g. sdpa)."),
    # --- automatic layout (accelerando only; accelerando.core.parallelism_layout) -----------------------
    Field("parallelism", "choice", None, group="layout", cli="--parallelism", choices=("auto", "manual"),
          help="auto: choose tp / pp / dp_shard / dp_replicate from the model (--parallelism_model) and the "
               "machine; the layout and its reasons are shown by --dry_run. manual: the sizes given."),
    Field("parallelism_model", "str", None, group="layout", cli="--parallelism_model",
          help="transformers config.json (or its folder) of the model the automatic layout plans for."),
    Field("parallelism_batch_size", "int", None, group="layout", cli="--parallelism_batch_size", minimum=1,
          help="Micro-batch per data-parallel rank the automatic layout plans for (default 1)."),
    Field("parallelism_seq_length", "int", None, group="layout", cli="--parallelism_seq_length", minimum=1,
          help="Tokens per sample the automatic layout plans for (default 2048)."),
    Field("parallelism_device_memory", "str", None, group="layout", cli="--parallelism_device_memory",
          help="Memory of one device for the automatic layout, e.g. 80GB (default: detected)."),
    Field("parallelism_simulate", "bool", None, group="layout", cli="--parallelism_simulate", switch=True,
          help="Check the automatic layout's memory by simulating a training step (fake tensors, "
               "accelerando.backends.planning) instead of the formula alone; slower (seconds per layout tried)."),
    # --- FP8 (used with mixed_precision fp8) ------------------------------------------------------
    _fp8("fp8_backend", "choice", "FP8 backend: ao (torchao), te (Transformer Engine), msamp (MS-AMP).",
         choices=("ao", "te", "msamp")),
    _fp8("fp8_use_autocast_during_eval", "bool", "Keep FP8 autocast in eval mode (te).", switch=True),
    _fp8("fp8_use_mxfp8_block_scaling", "bool", "MXFP8 block scaling instead of per-tensor scales (te).",
         switch=True),
    _fp8("fp8_margin", "int", "Margin of the scaling factor (te).", minimum=0),
    _fp8("fp8_interval", "int", "Steps between scaling-factor updates (te).", minimum=1),
    _fp8("fp8_format", "choice", "FP8 recipe format (te).", choices=("HYBRID", "E4M3", "E5M2"),
         keys=("fp8_config.fp8_format",)),
    _fp8("fp8_amax_history_len", "int", "Length of the amax history (te).", minimum=1,
         keys=("fp8_config.amax_history_length",)),
    _fp8("fp8_amax_compute_algo", "choice", "How amax is computed from its history (te).",
         choices=("max", "most_recent"), keys=("fp8_config.amax_compute_algorithm",)),
    _fp8("fp8_override_linear_precision", "str",
         "Three comma-separated booleans: run fprop, dgrad, wgrad in higher precision (te)."),
    _fp8("fp8_opt_level", "choice", "MS-AMP optimisation level (msamp).", choices=("O1", "O2")),
    _fp8("fp8_enable_fsdp_float8_all_gather", "bool", "FSDP2 all-gathers in float8 (ao)."),
    _fp8("fp8_pad_inner_dim", "bool", "Pad the inner dimension of FP8 matmuls (ao)."),
    # --- mpirun (multi-CPU jobs started through MPI) ----------------------------------------------
    Field("mpirun_hostfile", "str", None, group="mpirun", export=False, cli="--mpirun_hostfile",
          config_keys=("mpirun_config.mpirun_hostfile",),
          help="Start a multi-CPU job through mpirun with this hostfile (--hostfile / -f)."),
    Field("mpirun_ccl", "int", None, group="mpirun", export=False, cli="--mpirun_ccl", minimum=0,
          config_keys=("mpirun_config.mpirun_ccl",),
          help="oneCCL worker threads per process (CCL_WORKER_COUNT) of an mpirun job."),
)
# fmt: on

FIELDS_BY_NAME: dict[str, Field] = {f.name: f for f in FIELDS}
GROUPS: tuple[str, ...] = tuple(dict.fromkeys(f.group for f in FIELDS))


def get_field(name: str) -> Field:
    """Return the :class:`Field` called ``name``.

    Args:
        name: a setting name, e.g. ``"mixed_precision"``.

    Returns:
        The field's table row.

    Raises:
        KeyError: when no setting has that name (the message suggests a close one).
    """
    try:
        return FIELDS_BY_NAME[name]
    except KeyError:
        import difflib

        close = difflib.get_close_matches(name[:200], FIELDS_BY_NAME, n=1) if isinstance(name, str) else []
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise KeyError(f"Unknown setting {quote_value(name)}.{hint}") from None


def fields_in_group(group: str) -> tuple[Field, ...]:
    """Return the fields of one group (``"core"``, ``"launch"``, ``"fsdp"``, ...).

    Args:
        group: a group name from :data:`GROUPS`.

    Returns:
        The group's fields in table order.

    Raises:
        ValueError: when ``group`` is not a known group.
    """
    if group not in GROUPS:
        raise ValueError(f"Unknown settings group {group!r}; use one of {', '.join(GROUPS)}.")
    return tuple(f for f in FIELDS if f.group == group)
