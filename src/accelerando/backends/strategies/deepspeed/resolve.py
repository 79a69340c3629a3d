"""Turn a DeepSpeedPlugin's config into the concrete dict given to ``deepspeed.initialize``.

Order (each step may need the previous one): ZeRO stage/offload "auto" (needs the model size) ->
accumulation (needs the Accelerator) -> batch sizes (need accumulation and the dataloaders) -> the
MS-AMP block (when the FP8 backend is MS-AMP; it may turn bf16 on) -> precision, clipping, 16-bit save
-> bucket sizes (need the model's hidden size) -> optimizer and scheduler sections (need the objects
passed to prepare) -> nothing "auto" may remain.
``zero_init_config`` (the view of a config ``deepspeed.zero.Init`` accepts before that) lives with the
plugin, which needs it before any prepare; it is re-exported here.
"""

from __future__ import annotations

import copy
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from accelerando.backends.strategies.deepspeed.auto_stage import (
    ZeroChoice,
    choose_zero_config,
    estimate_zero_memory,
)
from accelerando.backends.strategies.deepspeed.config import (
    AUTO,
    fill_auto,
    get_value,
    require_no_auto,
    set_value,
)
from accelerando.backends.strategies.deepspeed.msamp import apply_msamp_block
from accelerando.backends.strategies.deepspeed.wrappers import DummyOptim, DummyScheduler
from accelerando.plugins.deepspeed import zero_init_config

if TYPE_CHECKING:
    from accelerando.core.devices import DeviceBackend
    from accelerando.plugins.deepspeed import DeepSpeedPlugin

__all__ = ["PrepareInputs", "resolve_config", "zero_init_config"]

logger = logging.getLogger(__name__)


@dataclass
class PrepareInputs:
    """What one ``prepare`` call gives the DeepSpeed strategy.

    Attributes:
        model: the model to wrap in an engine.
        optimizer: a torch optimizer, a ``DummyOptim`` or None.
        scheduler: a torch scheduler, a ``DummyScheduler`` or None.
        batch_sizes: per-process batch sizes of the training dataloaders (this call's, else earlier ones).
        num_processes: data-parallel world size.
        gradient_accumulation_steps: the Accelerator's value.
        mixed_precision: the Accelerator's value.
        device: this process's device (memory query for the automatic stage).
        device_backend: the device family (``total_memory``).
        is_train_batch_min: smallest (True) or largest batch size wins.
        local_processes: processes on this machine (they share its RAM).
        msamp_opt_level: the MS-AMP level when the run's FP8 backend is MS-AMP (adds the
            ``"msamp"`` block), else None.
    """

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer | DummyOptim | None
    scheduler: object
    batch_sizes: list[int]
    num_processes: int
    gradient_accumulation_steps: int
    mixed_precision: str
    device: torch.device
    device_backend: type[DeviceBackend] | None = None
    is_train_batch_min: bool = True
    local_processes: int = 1
    msamp_opt_level: str | None = None


def _physical_memory() -> int | None:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


def _num_params(model: torch.nn.Module) -> int:
    # Under deepspeed.zero.Init parameters are empty placeholders; ds_numel is the real size.
    return sum(int(getattr(p, "ds_numel", p.numel())) for p in model.parameters())


def _apply_auto_zero(config: dict[str, object], inputs: PrepareInputs) -> ZeroChoice | None:
    """Resolve ``stage`` / offload devices left "auto" from the model size and device memory."""
    stage = get_value(config, "zero_optimization.stage")
    off_opt = get_value(config, "zero_optimization.offload_optimizer.device")
    off_par = get_value(config, "zero_optimization.offload_param.device")
    if AUTO not in (stage, off_opt, off_par):
        return None
    ram = _physical_memory()
    device_memory = None
    if inputs.device.type != "cpu" and inputs.device_backend is not None:
        device_memory = inputs.device_backend.total_memory(inputs.device.index or 0)
    if device_memory is None:  # CPU training: the processes of this machine share its RAM
        device_memory = (ram or 16 * 1024**3) // max(inputs.local_processes, 1)
    num_params = _num_params(inputs.model)
    if stage == AUTO:
        choice = choose_zero_config(
            num_params, device_memory, inputs.num_processes, ram, inputs.mixed_precision
        )
    else:
        choice = _offload_for_fixed_stage(int(stage), num_params, device_memory, inputs)
    set_value(config, "zero_optimization.stage", choice.stage)
    if off_opt in (AUTO, None):
        set_value(config, "zero_optimization.offload_optimizer.device", choice.offload_optimizer_device)
    if off_par in (AUTO, None):
        set_value(config, "zero_optimization.offload_param.device", choice.offload_param_device)
    logger.warning("DeepSpeed 'auto' configuration: %s", choice.reason)
    return choice


def _offload_for_fixed_stage(
    stage: int, num_params: int, device_memory: int, inputs: PrepareInputs
) -> ZeroChoice:
    """The least offload that fits at a stage the user fixed (the most offload when none fits)."""
    budget = device_memory * 0.8
    options = [(False, False), (True, False)] + ([(True, True)] if stage == 3 else [])
    for off_opt, off_par in options:
        dev, cpu = estimate_zero_memory(
            num_params, inputs.num_processes, stage, inputs.mixed_precision, off_opt, off_par
        )
        if dev <= budget or (off_opt, off_par) == options[-1]:
            break
    what = "optimizer offload" if off_opt else "no offload"
    what += " and parameter offload" if off_par else ""
    reason = (
        f"ZeRO-{stage} (given) with {what}: {dev / 1024**3:.2f} GiB per device "
        f"of {budget / 1024**3:.2f} GiB usable"
    )
    return ZeroChoice(stage, "cpu" if off_opt else "none", "cpu" if off_par else "none", dev, cpu, reason)


def _resolve_batch(config: dict[str, object], inputs: PrepareInputs, gas: int) -> None:
    """Fill / check ``train_micro_batch_size_per_gpu`` and ``train_batch_size``.

    Raises:
        ValueError: a concrete config batch size that disagrees with the dataloader.
    """
    micro = None
    if inputs.batch_sizes:
        micro = min(inputs.batch_sizes) if inputs.is_train_batch_min else max(inputs.batch_sizes)
    given = get_value(config, "train_micro_batch_size_per_gpu")
    if given not in (None, AUTO) and micro is not None and int(given) != micro:
        raise ValueError(
            f"the DeepSpeed config has train_micro_batch_size_per_gpu={given} but the dataloader gives "
            f'{micro} samples per process; set it to "auto" or make the dataloader\'s batch_size match'
        )
    if given not in (None, AUTO):
        micro = int(given)
    if given is None and micro is not None:
        config["train_micro_batch_size_per_gpu"] = micro
    fill_auto(config, {"train_micro_batch_size_per_gpu": micro})
    total = None if micro is None else micro * gas * inputs.num_processes
    given_total = get_value(config, "train_batch_size")
    if given_total not in (None, AUTO) and total is not None and int(given_total) != total:
        raise ValueError(
            f"the DeepSpeed config has train_batch_size={given_total} but micro batch {micro} x accumulation "
            f'{gas} x {inputs.num_processes} processes = {total}; set train_batch_size to "auto"'
        )
    fill_auto(config, {"train_batch_size": total})


def _resolve_accumulation(config: dict[str, object], inputs: PrepareInputs) -> int:
    gas = get_value(config, "gradient_accumulation_steps")
    if gas in (None, AUTO):
        gas = inputs.gradient_accumulation_steps
        set_value(config, "gradient_accumulation_steps", gas)
    return int(gas)


def _hidden_size(model: torch.nn.Module) -> int | None:
    cfg = getattr(model, "config", None)
    if cfg is None:
        return None
    hidden = getattr(cfg, "hidden_size", None)
    if hidden is None and getattr(cfg, "hidden_sizes", None):
        hidden = max(cfg.hidden_sizes)
    return int(hidden) if hidden is not None else None


def _resolve_numerics(config: dict[str, object], inputs: PrepareInputs, plugin: DeepSpeedPlugin) -> None:
    for fmt in ("fp16", "bf16"):
        fill_auto(config, {f"{fmt}.enabled": inputs.mixed_precision == fmt})
    clip = plugin.gradient_clipping if isinstance(plugin.gradient_clipping, (int, float)) else 0.0
    fill_auto(config, {"gradient_clipping": float(clip)})
    save16 = plugin.zero3_save_16bit_model if isinstance(plugin.zero3_save_16bit_model, bool) else False
    fill_auto(config, {"zero_optimization.stage3_gather_16bit_weights_on_model_save": save16})
    hidden = _hidden_size(inputs.model)
    if hidden is not None:
        fill_auto(
            config,
            {
                "zero_optimization.reduce_bucket_size": hidden * hidden,
                "zero_optimization.stage3_prefetch_bucket_size": int(0.9 * hidden * hidden),
                "zero_optimization.stage3_param_persistence_threshold": 10 * hidden,
            },
        )


def _resolve_optimizer(config: dict[str, object], inputs: PrepareInputs) -> None:
    """Check the optimizer matches the config's "optimizer" section and fill its "auto" values.

    Raises:
        ValueError: a DummyOptim without an "optimizer" section, or a real optimizer with one.
    """
    opt = inputs.optimizer
    has_section = "optimizer" in config
    if isinstance(opt, DummyOptim):
        if not has_section:
            raise ValueError(
                'DummyOptim needs an "optimizer" section in the DeepSpeed config; add one or pass a '
                "torch optimizer instead"
            )
        betas = opt.kwargs.get("betas")
        fill_auto(
            config,
            {
                "optimizer.params.lr": opt.lr,
                "optimizer.params.weight_decay": opt.weight_decay,
                "optimizer.params.betas": list(betas) if isinstance(betas, Iterable) else None,
                "optimizer.params.eps": opt.kwargs.get("eps"),
            },
        )
    elif opt is not None and has_section:
        raise ValueError(
            'the DeepSpeed config has an "optimizer" section, so DeepSpeed builds the optimizer: pass '
            "accelerando.utils.DummyOptim(model.parameters(), lr=...) instead of a torch optimizer, or "
            "remove the section"
        )
    elif opt is not None:
        group = opt.param_groups[0]
        # The script's optimizer is used as is; its values only fill "auto" left elsewhere.
        fill_auto(config, {"optimizer.params.lr": group.get("lr")})
    section = config.get("optimizer")
    if isinstance(section, dict) and inputs.device.type == "cpu":
        params = section.setdefault("params", {})
        kind = str(section.get("type", "")).lower()
        if isinstance(params, dict) and kind in ("adam", "adamw") and "torch_adam" not in params:
            # DeepSpeed's fused/CPU Adam are compiled ops; torch's Adam needs no build on CPU.
            params["torch_adam"] = True
            params.setdefault("adam_w_mode", kind == "adamw")
    if opt is not None and not isinstance(opt, DummyOptim):
        # ZeRO refuses optimizers outside DeepSpeed's tested list unless told; the script's choice wins.
        config.setdefault("zero_allow_untested_optimizer", True)
        if get_value(config, "zero_optimization.offload_optimizer.device") not in (None, "none"):
            config.setdefault("zero_force_ds_cpu_optimizer", False)


def _resolve_scheduler(config: dict[str, object], inputs: PrepareInputs) -> None:
    """Check the scheduler matches the config's "scheduler" section and fill its "auto" values.

    Raises:
        ValueError: a DummyScheduler without a section (or callable), or a torch scheduler with one.
    """
    sched = inputs.scheduler
    has_section = "scheduler" in config
    if isinstance(sched, DummyScheduler):
        if not has_section and sched.lr_scheduler_callable is None:
            raise ValueError(
                'DummyScheduler needs a "scheduler" section in the DeepSpeed config or '
                "lr_scheduler_callable=...; add one or pass a torch scheduler"
            )
        lr = get_value(config, "optimizer.params.lr")
        if not isinstance(lr, (int, float)) and isinstance(inputs.optimizer, DummyOptim):
            lr = inputs.optimizer.lr
        values = {
            "scheduler.params.warmup_min_lr": 0.0,
            "scheduler.params.warmup_max_lr": lr if isinstance(lr, (int, float)) else None,
            "scheduler.params.warmup_num_steps": sched.warmup_num_steps,
            "scheduler.params.total_num_steps": sched.total_num_steps,
        }
        values.update({f"scheduler.params.{k}": v for k, v in sched.kwargs.items()})
        fill_auto(config, values)
    elif sched is not None and has_section:
        raise ValueError(
            'the DeepSpeed config has a "scheduler" section: pass accelerando.utils.DummyScheduler(...) '
            "instead of a torch scheduler, or remove the section"
        )
    if has_section and "optimizer" not in config and isinstance(inputs.optimizer, DummyOptim):
        raise ValueError('a DeepSpeed "scheduler" section with DummyOptim needs an "optimizer" section too')


def resolve_config(
    plugin: DeepSpeedPlugin, inputs: PrepareInputs
) -> tuple[dict[str, object], ZeroChoice | None]:
    """Return the concrete config for ``deepspeed.initialize`` and the automatic ZeRO choice (or None).

    Raises:
        ValueError: batch-size mismatches, optimizer/scheduler mismatches, or "auto" values that
            cannot be inferred (all named).
    """
    config = copy.deepcopy(plugin.deepspeed_config)
    choice = _apply_auto_zero(config, inputs)
    gas = _resolve_accumulation(config, inputs)
    _resolve_batch(config, inputs, gas)
    apply_msamp_block(config, inputs.msamp_opt_level, inputs.mixed_precision)
    _resolve_numerics(config, inputs, plugin)
    _resolve_optimizer(config, inputs)
    _resolve_scheduler(config, inputs)
    require_no_auto(config)
    return config, choice
