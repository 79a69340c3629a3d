"""The parts of the Megatron-LM engine that megatron-core runs on the CPU, for real.

megatron-core builds its model-parallel groups over gloo and constructs its models with
``use_cpu_initialization``; its DDP buffers, RNG tracker and forward need CUDA, and those paths must
refuse clearly here. Skipped when megatron-core is not installed.
"""

from __future__ import annotations

import types
import warnings

import pytest
import torch

pytest.importorskip("megatron.core", reason="megatron-core is not installed")

from accelerando.backends.strategies.megatron import args as margs  # noqa: E402
from accelerando.backends.strategies.megatron import config as mconfig  # noqa: E402
from accelerando.backends.strategies.megatron.engine import _average_loss_dicts, split_micro_batches  # noqa: E402
from accelerando.utils.megatron_lm import MegatronLMUnavailableError  # noqa: E402

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU behaviour")


def _gpt_plugin(**kwargs):
    from transformers import GPT2Config, GPT2LMHeadModel

    from accelerando.plugins.megatron import MegatronLMPlugin

    plugin = MegatronLMPlugin(**kwargs)
    model = GPT2LMHeadModel(GPT2Config(n_layer=4, n_embd=32, n_head=4, vocab_size=100, n_positions=16))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plugin.set_network_size_args(model, {"input_ids": torch.zeros(2, 9, dtype=torch.long)})
    plugin.set_training_args(2, 1)
    plugin.set_optimizer_type(torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.8, 0.95)))
    return plugin


def test_arguments_derive_sizes_and_megatron_configs():
    plugin = _gpt_plugin(
        tp_degree=2, pp_degree=2, num_micro_batches=4, num_layers_per_virtual_pipeline_stage=1
    )
    plugin.set_mixed_precision("bf16")
    args = margs.build_args(plugin.megatron_lm_default_args, {"recompute_granularity": "selective"})
    assert args.virtual_pipeline_model_parallel_size == 2  # 4 layers / 2 stages / 1 layer each
    assert args.padded_vocab_size == 256  # 100 padded to a multiple of 128 * tp
    assert args.global_batch_size == 2 * 1 * 4
    config = mconfig.transformer_config(args)
    assert (config.num_layers, config.hidden_size, config.num_attention_heads) == (4, 32, 4)
    assert config.tensor_model_parallel_size == 2 and config.pipeline_model_parallel_size == 2
    assert config.virtual_pipeline_model_parallel_size == 2 and config.bf16
    assert config.params_dtype == torch.bfloat16 and config.recompute_granularity == "selective"
    assert config.use_cpu_initialization is (not torch.cuda.is_available())
    assert config.variable_seq_lengths  # pipelines exchange shapes
    optimizer = mconfig.optimizer_config(args)
    assert (optimizer.optimizer, optimizer.lr, optimizer.adam_beta1, optimizer.adam_beta2) == (
        "adam",
        1e-3,
        0.8,
        0.95,
    )
    assert optimizer.bf16 and optimizer.clip_grad == 1.0
    assert mconfig.ddp_config(args).grad_reduce_in_fp32  # bf16 reduces gradients in fp32

    with pytest.raises(ValueError, match="num_layers_per_virtual_pipeline_stage"):
        margs.build_args({**plugin.megatron_lm_default_args, "num_layers_per_virtual_pipeline_stage": 3})
    with pytest.raises(ValueError, match="other_megatron_args"):
        mconfig.transformer_config(margs.build_args({}))
    with pytest.raises(ValueError, match="learning rate"):
        mconfig.optimizer_config(margs.build_args({}))
    with pytest.raises(ValueError, match="attention_backend"):
        mconfig.transformer_config(
            margs.build_args({**plugin.megatron_lm_default_args, "attention_backend": "nope"})
        )
    local = margs.build_args({**plugin.megatron_lm_default_args, "attention_backend": "local"})
    assert mconfig.transformer_config(local).attention_backend.name == "local"


def test_schedule_in_samples():
    from accelerando.utils.megatron_lm import MegatronLMDummyScheduler

    plugin = _gpt_plugin(num_micro_batches=2, lr_decay_style="cosine", min_lr=1e-5)
    plugin.set_scheduler_args(MegatronLMDummyScheduler(None, total_num_steps=100, warmup_num_steps=10))
    steps = mconfig.scheduler_steps(margs.build_args(plugin.megatron_lm_default_args))
    gbs = 2 * 2  # micro-batch 2, one data-parallel rank, 2 micro-batches
    assert steps["lr_decay_steps"] == 100 * gbs and steps["lr_warmup_steps"] == 10 * gbs
    assert steps["lr_decay_style"] == "cosine" and steps["min_lr"] == 1e-5 and steps["max_lr"] == 1e-3
    constant = mconfig.scheduler_steps(margs.build_args(_gpt_plugin().megatron_lm_default_args))
    assert constant["lr_decay_style"] == "constant"
    samples = margs.build_args(
        {**plugin.megatron_lm_default_args, "train_samples": 640, "lr_warmup_fraction": 0.1}
    )
    steps = mconfig.scheduler_steps(samples)
    assert steps["lr_decay_steps"] == 640 and steps["lr_warmup_steps"] == 64


def test_micro_batches_and_loss_averaging():
    batch = {"input_ids": torch.arange(8).reshape(4, 2), "labels": torch.ones(4, 2), "flag": 3}
    parts = split_micro_batches(batch, 2)
    assert [p["input_ids"].tolist() for p in parts] == [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]
    assert all(p["flag"] == 3 for p in parts)
    with pytest.raises(ValueError, match="num_micro_batches=3"):
        split_micro_batches(batch, 3)
    averaged = _average_loss_dicts([{"lm loss": torch.tensor(1.0)}, {"lm loss": torch.tensor(3.0)}])
    assert averaged["lm loss"].item() == 2.0
    joined = _average_loss_dicts([{"logits": torch.ones(1, 2)}, {"logits": torch.zeros(1, 2)}])
    assert joined["logits"].shape == (2, 2)


def test_gpt_loss_with_logits():
    from accelerando.utils.megatron_lm import GPTTrainStep

    step = GPTTrainStep(None, types.SimpleNamespace(return_logits=True))
    assert step.return_logits
    losses, logits = torch.tensor([[1.0, 3.0], [5.0, 7.0]]), torch.zeros(2, 2, 4)
    loss, reduced = step.loss_func(torch.tensor([[1.0, 1.0], [0.0, 1.0]]), (losses, logits))
    assert loss.item() == pytest.approx(11.0 / 3) and reduced["logits"] is logits
    assert set(reduced) == {"lm loss", "logits"}


def test_strategy_reads_one_prepare_call_into_the_arguments():
    from transformers import GPT2Config, GPT2LMHeadModel

    from accelerando.backends.strategies.base import PrepareRequest
    from accelerando.backends.strategies.megatron.strategy import MegatronStrategy, _kind
    from accelerando.plugins.megatron import MegatronLMPlugin
    from accelerando.utils.megatron_lm import MegatronLMDummyScheduler

    plugin = MegatronLMPlugin(tp_degree=2, num_micro_batches=2)
    runtime = types.SimpleNamespace(
        plugins=types.SimpleNamespace(megatron_lm=plugin), num_processes=4, mixed_precision="bf16"
    )
    strategy = MegatronStrategy(runtime, None)
    model = GPT2LMHeadModel(GPT2Config(n_layer=3, n_embd=32, n_head=4, vocab_size=100, n_positions=16))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.8)
    loader = torch.utils.data.DataLoader([{"input_ids": torch.zeros(9, dtype=torch.long)}] * 6, batch_size=3)
    scheduler = MegatronLMDummyScheduler(optimizer, total_num_steps=20, warmup_num_steps=4)
    valid = torch.utils.data.DataLoader([{"input_ids": torch.zeros(9, dtype=torch.long)}] * 6, batch_size=5)
    objects = (model, optimizer, loader, scheduler, valid)
    assert [_kind(o) for o in objects] == ["model", "optimizer", "dataloader", "scheduler", "dataloader"]
    request = PrepareRequest(objects, (None,) * 5, 1, False, lambda obj, placement: obj, lambda obj: False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        strategy._fill_arguments(
            plugin,
            {"model": model, "optimizer": optimizer, "dataloader": loader, "scheduler": scheduler},
            request,
        )
    args = plugin.megatron_lm_default_args
    # is_train_batch_min (default True): the smaller of the two loaders' batch sizes.
    assert (args["micro_batch_size"], args["data_parallel_size"], args["global_batch_size"]) == (3, 2, 12)
    assert (args["num_layers"], args["hidden_size"], args["seq_length"]) == (3, 32, 9)
    assert (args["optimizer"], args["lr"], args["sgd_momentum"]) == ("sgd", 0.5, 0.8)
    assert args["bf16"] and args["train_iters"] == 10 and args["lr_warmup_iters"] == 2  # steps per dp rank
    with pytest.raises(ValueError, match="pipeline_model_parallel_split_rank"):
        mconfig.check_supported(margs.build_args({"pipeline_model_parallel_split_rank": 2}))
    with pytest.raises(ValueError, match="use_custom_fsdp"):
        mconfig.check_supported(margs.build_args({"use_custom_fsdp": True}))
    mconfig.check_supported(margs.build_args(args))
    step_lr = torch.optim.lr_scheduler.StepLR(optimizer, 1)
    with pytest.raises(ValueError, match="MegatronLMDummyScheduler"):
        strategy._fill_arguments(
            plugin, {"model": None, "optimizer": None, "dataloader": None, "scheduler": step_lr}, request
        )


def test_tensorboard_scalars(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from accelerando.backends.strategies.megatron.board import TrainingBoard

    args = types.SimpleNamespace(
        tensorboard_dir=str(tmp_path), global_batch_size=8, log_batch_size_to_tensorboard=True,
        log_validation_ppl_to_tensorboard=True, log_loss_scale_to_tensorboard=False,
    )  # fmt: skip
    board = TrainingBoard(args)
    board.train_step(1, {"lm loss": torch.tensor(2.5), "logits": torch.ones(2, 2)}, 1e-3, 1.0, 0.5, None)
    board.validation(1, {"lm loss": 2.0})
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert tags == {
        "lm loss",
        "learning-rate",
        "batch-size",
        "grad-norm",
        "lm loss validation",
        "lm loss validation ppl",
    }
    assert events.Scalars("lm loss")[0].value == 2.5 and events.Scalars("batch-size")[0].value == 8
    assert TrainingBoard(types.SimpleNamespace()).writer is None  # no tensorboard_dir: nothing written


@no_cuda
def test_cuda_paths_refuse_on_cpu_naming_the_alternative():
    from accelerando.utils import megatron_lm as mlm

    holder = types.SimpleNamespace(state=types.SimpleNamespace(megatron_lm_plugin=_gpt_plugin()))
    calls = [
        lambda: mlm.initialize(holder),
        mlm.finish_mpu_init,
        lambda: mlm.prepare_model_optimizer_scheduler(holder),
        lambda: mlm.prepare_optimizer(holder, []),
        lambda: mlm.MegatronEngine(holder, [], None, None),
    ]
    for call in calls:
        with pytest.raises(MegatronLMUnavailableError) as info:
            call()
        message = str(info.value)
        assert "no CUDA GPU" in message and "ParallelismConfig(tp_size=...)" in message
        assert "PipelineParallelPlugin" in message


# --------------------------------------------------------------------------- two gloo processes
def _group_ranks(group) -> list[int]:
    return sorted(torch.distributed.get_process_group_ranks(group))


def _parallel_state_on_gloo() -> dict:
    warnings.simplefilter("ignore")
    from megatron.core import parallel_state as ps

    from accelerando.backends.strategies.megatron.models import build_model_chunks
    from accelerando.backends.strategies.megatron.setup import (
        init_model_parallel,
        model_provider_func,
        prepare_data_loader,
    )
    from accelerando.parallelism_config import ParallelismConfig
    from accelerando.state import PartialState

    PartialState()  # starts the gloo process group, as the Accelerator does
    out: dict = {}
    plugin = _gpt_plugin(tp_degree=2)
    args = margs.build_args(plugin.megatron_lm_default_args)
    margs.set_args(args)
    init_model_parallel(args)
    mesh = ParallelismConfig(tp_size=2).build_device_mesh("cpu")
    out["tp"] = (
        _group_ranks(ps.get_tensor_model_parallel_group()),
        sorted(mesh["tp"].mesh.flatten().tolist()),
    )
    out["tp_rank"] = (ps.get_tensor_model_parallel_rank(), mesh["tp"].get_local_rank())
    out["dp_size"] = args.data_parallel_size
    gpt = build_model_chunks(model_provider_func, args)
    out["gpt"] = (len(gpt), type(gpt[0]).__name__, tuple(gpt[0].embedding.word_embeddings.weight.shape))
    # Both tensor-parallel ranks read the same samples (one data-parallel rank).
    loader = torch.utils.data.DataLoader(torch.arange(8).float().unsqueeze(1), batch_size=2)
    out["tp_batches"] = [
        b.flatten().tolist() for b in prepare_data_loader(types.SimpleNamespace(state=PartialState()), loader)
    ]
    # return_logits: per-token losses from vocabulary-parallel logits, logits gathered back whole.
    from accelerando.backends.strategies.megatron.train_steps import _with_logits

    full = torch.randn(2, 3, 256, generator=torch.Generator().manual_seed(0))
    labels = torch.tensor([[1, 200, 7], [255, 0, 128]])
    rank = ps.get_tensor_model_parallel_rank()
    losses, logits = _with_logits(full[..., rank * 128 : (rank + 1) * 128].clone(), gpt[0], labels)
    expected = torch.nn.functional.cross_entropy(full.reshape(-1, 256), labels.reshape(-1), reduction="none")
    out["logits"] = (torch.allclose(losses.reshape(-1), expected, atol=1e-5), torch.equal(logits, full))
    for kind in ("bert", "t5"):
        args.model_type_name = kind
        out[kind] = type(model_provider_func()).__name__

    # tp=1: two data-parallel ranks, each its own samples.
    args = margs.build_args(_gpt_plugin().megatron_lm_default_args)
    margs.set_args(args)
    init_model_parallel(args)
    out["dp"] = (_group_ranks(ps.get_data_parallel_group()), args.data_parallel_size, args.global_batch_size)
    # Megatron-style data iterators from a custom provider: sample counts asked, sharding, resumption.
    from accelerando.backends.strategies.megatron.train_steps import _dataset_iterators

    args.consumed_samples, args.train_iters, args.eval_interval, args.eval_iters = [4, 0, 0], 2, 1, 1
    asked = []

    def provider(counts):
        asked.append(counts)
        return list(range(16)), None, list(range(100, 108))

    train, valid, test = _dataset_iterators(provider)
    out["iterators"] = (asked[0], [b.tolist() for b in train], valid, next(test).tolist())
    out["dp_batches"] = [
        b.flatten().tolist() for b in prepare_data_loader(types.SimpleNamespace(state=PartialState()), loader)
    ]

    # pp=2 with two virtual stages each: rank 0 holds the embedding, rank 1 the output layer.
    plugin = _gpt_plugin(pp_degree=2, num_layers_per_virtual_pipeline_stage=1)
    # Untied: tied embeddings are synchronised between the first and last stage on CUDA at construction.
    args = margs.build_args(plugin.megatron_lm_default_args, {"untie_embeddings_and_output_weights": True})
    margs.set_args(args)
    init_model_parallel(args)
    chunks = build_model_chunks(model_provider_func, args)
    out["pp"] = (
        _group_ranks(ps.get_pipeline_model_parallel_group()),
        len(chunks),
        [c.pre_process for c in chunks],
        [c.post_process for c in chunks],
        [len(c.decoder.layers) for c in chunks],
    )
    args.model_type_name = "t5"
    try:
        model_provider_func()
    except ValueError as error:
        out["t5_pp"] = str(error)
    ps.destroy_model_parallel()
    return out


@pytest.mark.slow
def test_parallel_state_and_models_on_two_gloo_processes():
    from accelerando.test_utils import run_distributed

    results = run_distributed(_parallel_state_on_gloo, 2, timeout=600)
    for rank, out in enumerate(results):
        groups, mesh_ranks = out["tp"]
        assert groups == mesh_ranks == [0, 1]  # megatron-core's tp group is our mesh's tp axis
        assert out["tp_rank"] == (rank, rank) and out["dp_size"] == 1
        assert out["gpt"] == (1, "GPTModel", (128, 32))  # vocabulary 256 split over 2 ranks
        assert out["tp_batches"] == [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0], [6.0, 7.0]]
        assert (out["bert"], out["t5"]) == ("BertModel", "T5Model")
        assert out["logits"] == (True, True)
        assert out["dp"] == ([0, 1], 2, 2 * 2)
        groups, chunks, pre, post, layers = out["pp"]
        assert groups == [0, 1] and chunks == 2 and layers == [1, 1]
        assert pre == [rank == 0, False] and post == [False, rank == 1]
        assert "pp_degree=1" in out["t5_pp"]
    counts, train, valid, test = results[0]["iterators"]
    assert (
        counts == [8, 12, 4] and valid is None
    )  # global batch 4: 2 train iters, 3 evals of 1 iter, 1 test iter
    assert train == [[4, 6], [8, 10], [12, 14]] and test == [100, 102]  # one consumed step skipped
    assert results[1]["iterators"][1] == [[5, 7], [9, 11], [13, 15]]
    assert results[0]["dp_batches"] != results[1]["dp_batches"]
    assert sorted(sum(results[0]["dp_batches"] + results[1]["dp_batches"], [])) == [
        float(i) for i in range(8)
    ]


# --------------------------------------------------------------------------- prepare, CUDA parts stubbed
class _ScaleOnly:
    """Stands for megatron-core's optimizer (CUDA-only): param groups and the loss scale the engine reads."""

    def __init__(self, params) -> None:
        self.param_groups = [{"params": list(params), "lr": 0.0, "weight_decay": 0.0}]
        self.state: dict = {}

    def scale_loss(self, loss):
        return loss


def _prepare_with_cuda_parts_stubbed() -> dict:
    warnings.simplefilter("ignore")
    import megatron.core.tensor_parallel as tensor_parallel
    from transformers import GPT2Config, GPT2LMHeadModel

    from accelerando import Accelerator
    from accelerando.backends.strategies.megatron import engine, setup, strategy
    from accelerando.plugins.megatron import MegatronLMPlugin
    from accelerando.utils.megatron_lm import MegatronLMDummyScheduler

    # Only what needs CUDA is replaced: the checks, the CUDA RNG tracker, moving to the GPU + DDP, the optimizer.
    def skip(*args, **kwargs):
        return None

    setup.require_cuda = strategy.require_megatron_and_cuda = engine.require_megatron_and_cuda = skip
    tensor_parallel.model_parallel_cuda_manual_seed = skip
    setup._wrap_chunks = lambda chunks, args: chunks
    setup.prepare_optimizer = lambda accelerator, model: _ScaleOnly(p for m in model for p in m.parameters())

    accelerator = Accelerator(megatron_lm_plugin=MegatronLMPlugin(num_micro_batches=2))
    torch.distributed.init_process_group("gloo")  # one process: the Accelerator starts no group
    hf = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=100, n_positions=32))
    optimizer = torch.optim.AdamW(hf.parameters(), lr=1e-3)
    loader = torch.utils.data.DataLoader([{"input_ids": torch.arange(17)}] * 8, batch_size=2)
    scheduler = MegatronLMDummyScheduler(optimizer, total_num_steps=10, warmup_num_steps=2)
    model, optimizer, loader, scheduler = accelerator.prepare(hf, optimizer, loader, scheduler)
    batch = next(iter(loader))
    optimizer.step()
    scheduler.step()
    accelerator.backward(torch.tensor(1.0))  # no-ops: the engine's call is the whole step
    return {
        "types": [type(o).__name__ for o in (model, optimizer, loader, scheduler)],
        "batches": [tuple(b["input_ids"].shape) for b in loader],
        "micro": [tuple(m["input_ids"].shape) for m in model.get_batch_data_iterator(batch)],
        "schedule": (
            scheduler.scheduler.lr_warmup_steps,
            scheduler.scheduler.lr_decay_steps,
            scheduler.scheduler.num_steps,
        ),
        "handler": (
            type(model.train_step_handler).__name__,
            model.train_step_handler.model_output_class.__name__,
        ),
        "finalize": model.module_config.finalize_model_grads_func.__name__,
        "registered": (len(accelerator._models), len(accelerator._optimizers), len(accelerator._schedulers)),
        "core": type(model.module[0]).__name__,
    }


@pytest.mark.slow
def test_prepare_builds_the_engine_up_to_cuda():
    from accelerando.test_utils import run_distributed

    (out,) = run_distributed(_prepare_with_cuda_parts_stubbed, 1, timeout=600)
    assert out["types"] == [
        "MegatronEngine",
        "MegatronLMOptimizerWrapper",
        "DataLoaderShard",
        "MegatronLMSchedulerWrapper",
    ]
    assert out["batches"] == [(4, 17), (4, 17)] and out["micro"] == [(2, 17), (2, 17)]  # 2 micro-batches of 2
    assert out["schedule"] == (2 * 4, 10 * 4, 0)  # samples: iterations x global batch 4; step() was a no-op
    assert out["handler"] == ("GPTTrainStep", "CausalLMOutputWithCrossAttentions")
    assert out["finalize"] == "finalize_model_grads" and out["registered"] == (1, 1, 1)
    assert out["core"] == "GPTModel"


def test_gradient_accumulation_is_refused_for_micro_batches(monkeypatch):
    from accelerando.backends.strategies.base import PrepareRequest
    from accelerando.backends.strategies.megatron import strategy as mstrategy

    monkeypatch.setattr(mstrategy, "require_megatron_and_cuda", lambda what: None)  # as on a GPU machine
    runtime = types.SimpleNamespace(
        plugins=types.SimpleNamespace(megatron_lm=None), num_processes=1, mixed_precision="no"
    )
    request = PrepareRequest((torch.nn.Linear(2, 2),), (None,), 4, False, lambda o, p: o, lambda o: False)
    with pytest.raises(ValueError, match="num_micro_batches"):
        mstrategy.MegatronStrategy(runtime, None).prepare_all(request)
