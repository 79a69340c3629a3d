"""Options of the non-data parallelism axes of :class:`~accelerando.parallelism_config.ParallelismConfig`.

One small dataclass per axis: tensor parallel (``tp_handler``), context parallel (``cp_handler``) and
DeepSpeed sequence parallel (``sp_handler``). Options left at ``None`` are read from the
``PARALLELISM_CONFIG_*`` environment variables a launcher passes on, else take their default. They
only describe what to do: building the mesh and sharding happen where the config is used.
"""

from __future__ import annotations

from dataclasses import dataclass

from accelerando.core.settings import environment_text

__all__ = ["DeepSpeedSequenceParallelConfig", "TorchContextParallelConfig", "TorchTensorParallelConfig"]

_ENV_PREFIX = "PARALLELISM_CONFIG_"
_TRUE = ("1", "true", "yes", "y", "on", "t")
_FALSE = ("0", "false", "no", "n", "off", "f")


def _env_bool(name: str, default: bool) -> bool:
    raw = environment_text(name)
    if raw is None or not raw.strip():
        return default
    text = raw.strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(f"Environment variable {name}={raw!r} is not a yes/no value; set it to true or false.")


def _check_bool(owner: str, name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{owner}.{name} must be True or False, got {value!r}.")


@dataclass
class TorchTensorParallelConfig:
    """Options of tensor parallelism (the ``tp`` axis).

    Attributes:
        enable_async_tp: overlap the tensor-parallel collectives with the matrix multiplications
            (PyTorch's asynchronous TP, through symmetric memory; needs CUDA and a torch.compile'd model).

    Raises:
        TypeError: if ``enable_async_tp`` is not a bool.
    """

    enable_async_tp: bool = False

    def __post_init__(self) -> None:
        _check_bool("TorchTensorParallelConfig", "enable_async_tp", self.enable_async_tp)


_CP_COMM_STRATEGIES = ("allgather", "alltoall")


@dataclass
class TorchContextParallelConfig:
    """Options of context parallelism (the ``cp`` axis): how the shards of a sequence meet in attention.

    Attributes:
        cp_comm_strategy: ``"allgather"`` (gather every shard's keys and values, then attend) or
            ``"alltoall"`` (exchange them in a ring, overlapping transfers with compute). ``None``
            reads ``PARALLELISM_CONFIG_CP_COMM_STRATEGY``, else ``"allgather"``.

    Raises:
        ValueError: for another strategy.
    """

    cp_comm_strategy: str | None = None

    def __post_init__(self) -> None:
        if self.cp_comm_strategy is None:
            self.cp_comm_strategy = environment_text(f"{_ENV_PREFIX}CP_COMM_STRATEGY", "allgather")
        if self.cp_comm_strategy not in _CP_COMM_STRATEGIES:
            raise ValueError(
                f"Invalid cp_comm_strategy: {self.cp_comm_strategy}. Must be one of 'allgather' or 'alltoall'."
            )


_SP_ATTN_IMPLEMENTATIONS = ("sdpa", "flash_attention_2", "flash_attention_3")


@dataclass
class DeepSpeedSequenceParallelConfig:
    """Options of DeepSpeed's sequence parallelism (Ulysses; the ``sp`` axis).

    Attributes:
        sp_seq_length: the sequence length every batch has; needed when it does not vary
            (``sp_seq_length_is_variable=False``). ``None`` reads ``PARALLELISM_CONFIG_SP_SEQ_LENGTH``.
        sp_seq_length_is_variable: batches may have different sequence lengths. ``None`` reads
            ``PARALLELISM_CONFIG_SP_SEQ_LENGTH_IS_VARIABLE``, else True.
        sp_attn_implementation: the attention kernel the model uses: ``"sdpa"``, ``"flash_attention_2"``,
            ``"flash_attention_3"`` or a Hub-hosted flash-attention kernel (``"org/...flash-attn..."``, e.g.
            ``"kernels-community/flash-attn2"``). ``None`` reads ``PARALLELISM_CONFIG_SP_ATTN_IMPLEMENTATION``,
            else stays ``None`` (the model's own choice).

    Raises:
        ValueError: an unknown attention implementation, a length below 1, or a fixed length that is
            not given.
    """

    sp_seq_length: int | None = None
    sp_seq_length_is_variable: bool | None = None
    sp_attn_implementation: str | None = None

    def __post_init__(self) -> None:
        if self.sp_seq_length_is_variable is None:
            self.sp_seq_length_is_variable = _env_bool(f"{_ENV_PREFIX}SP_SEQ_LENGTH_IS_VARIABLE", True)
        _check_bool(
            "DeepSpeedSequenceParallelConfig", "sp_seq_length_is_variable", self.sp_seq_length_is_variable
        )
        if self.sp_seq_length is None:
            raw = (environment_text(f"{_ENV_PREFIX}SP_SEQ_LENGTH") or "").strip()
            if raw:
                try:
                    self.sp_seq_length = int(raw)
                except ValueError:
                    raise ValueError(
                        f"Environment variable {_ENV_PREFIX}SP_SEQ_LENGTH={raw!r} is not an integer; set it "
                        "to the sequence length."
                    ) from None
        if self.sp_seq_length is not None and (
            isinstance(self.sp_seq_length, bool)
            or not isinstance(self.sp_seq_length, int)
            or self.sp_seq_length < 1
        ):
            raise ValueError(
                f"DeepSpeedSequenceParallelConfig.sp_seq_length must be an integer >= 1, got {self.sp_seq_length!r}."
            )
        if not self.sp_seq_length_is_variable and self.sp_seq_length is None:
            raise ValueError(
                "DeepSpeedSequenceParallelConfig: sp_seq_length_is_variable=False needs sp_seq_length (the fixed "
                "sequence length). Fix: pass sp_seq_length, or leave sp_seq_length_is_variable=True."
            )
        if self.sp_attn_implementation is None:
            self.sp_attn_implementation = environment_text(f"{_ENV_PREFIX}SP_ATTN_IMPLEMENTATION") or None
        implementation = self.sp_attn_implementation
        if implementation is not None and implementation not in _SP_ATTN_IMPLEMENTATIONS:
            # A Hub-hosted flash-attention kernel is named "org/...flash-attn..."; anything else is a typo.
            if not (
                isinstance(implementation, str) and "/" in implementation and "flash-attn" in implementation
            ):
                raise ValueError(
                    f"Invalid sp_attn_implementation: {implementation}. Must be one of "
                    f"{sorted(_SP_ATTN_IMPLEMENTATIONS)} or a hub-hosted flash attention kernel "
                    "(e.g. 'kernels-community/flash-attn2')."
                )
