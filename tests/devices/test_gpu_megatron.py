"""Megatron-LM through the Accelerator on one CUDA GPU, checked against megatron-core driven by hand.

A tiny GPT-2 is prepared with ``MegatronLMPlugin`` (tp=1, pp=1, two micro-batches) and trained for a
few steps with the ordinary loop (``loss = model(**batch).loss; backward; step``). The same
batches then train megatron-core's ``GPTModel`` built directly (same starting weights, megatron-core
DDP, optimizer and schedule called by hand): the losses and the final weights must agree. Then
``save_state`` / ``load_state`` restore the engine's weights through megatron-core's distributed
checkpointing.

Runs in a fresh process (megatron-core keeps global state). Skipped without CUDA, megatron-core or
transformers.
"""

from __future__ import annotations

import warnings

import pytest
import torch

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
pytest.importorskip("megatron.core", reason="megatron-core is not installed")
pytest.importorskip("transformers", reason="transformers is not installed")

STEPS = 3
MICRO_BATCH = 2
NUM_MICRO = 2
SEQ = 16  # tokens per sample after the shift (samples hold SEQ + 1 ids)


def _dataset() -> torch.utils.data.Dataset:
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 100, (STEPS * MICRO_BATCH * NUM_MICRO, SEQ + 1), generator=generator)

    class Ids(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return ids.shape[0]

        def __getitem__(self, index: int) -> dict:
            return {"input_ids": ids[index]}

    return Ids()


def _through_accelerator(checkpoint_dir: str) -> dict:
    from megatron.core.utils import unwrap_model
    from transformers import GPT2Config, GPT2LMHeadModel

    from accelerando import Accelerator
    from accelerando.plugins.megatron import MegatronLMPlugin

    plugin = MegatronLMPlugin(
        num_micro_batches=NUM_MICRO, attention_dropout=0.0, hidden_dropout=0.0, gradient_clipping=1.0
    )
    accelerator = Accelerator(megatron_lm_plugin=plugin)
    hf = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=100, n_positions=32))
    optimizer = torch.optim.AdamW(hf.parameters(), lr=1e-3, weight_decay=0.0)
    loader = torch.utils.data.DataLoader(_dataset(), batch_size=MICRO_BATCH)
    model, optimizer, loader = accelerator.prepare(hf, optimizer, loader)
    core = unwrap_model(model.module[0])
    initial = {k: v.detach().clone() for k, v in core.state_dict().items() if isinstance(v, torch.Tensor)}
    model.train()
    losses, batches = [], []
    for batch in loader:
        batches.append({k: v.detach().cpu().clone() for k, v in batch.items()})
        output = model(**batch)
        accelerator.backward(output.loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(output.loss))
    final = {k: v.detach().clone() for k, v in core.state_dict().items() if isinstance(v, torch.Tensor)}

    accelerator.save_state(checkpoint_dir)
    with torch.no_grad():
        for parameter in core.parameters():
            parameter.add_(1.0)
    accelerator.load_state(checkpoint_dir)
    restored = all(torch.equal(final[k], v) for k, v in core.state_dict().items() if k in final)
    return {"initial": initial, "final": final, "losses": losses, "batches": batches, "restored": restored}


def _by_hand(initial: dict, batches: list[dict]) -> dict:
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import (
        DistributedDataParallel,
        DistributedDataParallelConfig,
        finalize_model_grads,
    )
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed
    from megatron.core.transformer import TransformerConfig

    ps.destroy_model_parallel()
    ps.initialize_model_parallel(1, 1)
    model_parallel_cuda_manual_seed(1234)  # megatron-core initialises weights through its CUDA RNG tracker
    config = TransformerConfig(
        num_layers=2, hidden_size=64, num_attention_heads=4, hidden_dropout=0.0, attention_dropout=0.0
    )
    model = GPTModel(
        config=config,
        transformer_layer_spec=get_gpt_layer_local_spec(),
        vocab_size=128,  # 100 padded to Megatron's multiple of 128
        max_sequence_length=32,
        share_embeddings_and_output_weights=True,
    ).cuda()
    # strict=False: the copied weights leave out the layers' (empty) ``_extra_state`` entries.
    missing, _ = model.load_state_dict(initial, strict=False)
    missing = [key for key in missing if not key.endswith("_extra_state")]
    assert not missing, f"the by-hand model has weights the engine's lacks: {missing}"
    ddp = DistributedDataParallel(config, DistributedDataParallelConfig(), model)
    optimizer = get_megatron_optimizer(
        OptimizerConfig(
            optimizer="adam", lr=1e-3, weight_decay=0.0, clip_grad=1.0, adam_beta1=0.9, adam_beta2=0.999
        ),
        [ddp],
    )
    config.grad_scale_func = optimizer.scale_loss
    config.finalize_model_grads_func = finalize_model_grads

    def forward_step(iterator, chunk):
        ids = next(iterator)["input_ids"].cuda()
        tokens, labels = ids[:, :-1], ids[:, 1:]
        position_ids = torch.arange(tokens.shape[1], device=ids.device).unsqueeze(0).expand_as(tokens)
        mask = torch.ones(1, 1, tokens.shape[1], tokens.shape[1], device=ids.device).tril() < 0.5
        per_token = chunk(tokens, position_ids, mask, labels=labels)

        def loss(output):
            value = output.float().mean()
            return value, {"lm loss": value.detach()}

        return per_token, loss

    losses = []
    for batch in batches:
        ddp.zero_grad_buffer()
        optimizer.zero_grad()
        micro = [{"input_ids": part} for part in batch["input_ids"].chunk(NUM_MICRO)]
        reduced = get_forward_backward_func()(
            forward_step_func=forward_step,
            data_iterator=iter(micro),
            model=[ddp],
            num_microbatches=NUM_MICRO,
            seq_length=SEQ,
            micro_batch_size=MICRO_BATCH,
            forward_only=False,
        )
        optimizer.step()
        losses.append(float(sum(r["lm loss"] for r in reduced) / len(reduced)))
    final = {k: v.detach().clone() for k, v in model.state_dict().items() if isinstance(v, torch.Tensor)}
    return {"losses": losses, "final": final}


def _compare(checkpoint_dir: str) -> dict:
    warnings.simplefilter("ignore")
    ours = _through_accelerator(checkpoint_dir)
    hand = _by_hand(ours["initial"], ours["batches"])
    worst = max((ours["final"][k].float() - v.float()).abs().max().item() for k, v in hand["final"].items())
    return {
        "losses": ours["losses"],
        "hand_losses": hand["losses"],
        "worst_weight_diff": worst,
        "restored": ours["restored"],
        "trained": any(not torch.equal(ours["initial"][k], v) for k, v in ours["final"].items()),
        "batches": len(ours["batches"]),
    }


def test_megatron_gpt_trains_like_megatron_core_by_hand(tmp_path):
    from accelerando.test_utils import run_distributed

    (result,) = run_distributed(_compare, 1, str(tmp_path / "ckpt"), timeout=600)
    assert result["batches"] == STEPS  # each prepared batch holds both micro-batches of a step
    assert result["losses"] == pytest.approx(result["hand_losses"], rel=1e-4, abs=1e-5)
    assert result["trained"]  # the engine's steps changed the weights
    assert result["worst_weight_diff"] < 1e-4
    assert result["restored"]
