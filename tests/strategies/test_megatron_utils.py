"""The plain-torch parts of accelerando.utils.megatron_lm, and the refusals of the megatron-core parts."""

from __future__ import annotations

import types

import pytest
import torch

from accelerando.utils import megatron_lm as mlm
from accelerando.utils.megatron_lm import MegatronLMUnavailableError, T5TrainStep


def test_t5_masks_match_hand_computed():
    attention = torch.tensor([[1, 1, 0]])
    enc = T5TrainStep.attn_mask_postprocess(attention)
    expected_enc = torch.tensor([[[[False, False, True], [False, False, True], [True, True, True]]]])
    assert enc.shape == (1, 1, 3, 3) and torch.equal(enc, expected_enc)
    dec = T5TrainStep.get_decoder_mask(3, "cpu")
    assert torch.equal(
        dec, torch.tensor([[[False, True, True], [False, False, True], [False, False, False]]])
    )
    cross = T5TrainStep.get_enc_dec_mask(attention, 2, "cpu")
    assert torch.equal(cross, torch.tensor([[[False, False, True], [False, False, True]]]))


def test_dummy_scheduler_and_dataloader_record_their_arguments(monkeypatch):
    optimizer = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)
    scheduler = mlm.MegatronLMDummyScheduler(optimizer, total_num_steps=100, warmup_num_steps=10, foo=1)
    assert (scheduler.optimizer, scheduler.total_num_steps, scheduler.warmup_num_steps) == (
        optimizer,
        100,
        10,
    )
    assert scheduler.kwargs == {"foo": 1}

    from accelerando.plugins.megatron import MegatronLMPlugin

    plugin = MegatronLMPlugin()
    plugin.set_scheduler_args(scheduler)
    assert plugin.megatron_lm_default_args["train_iters"] == 100
    assert plugin.megatron_lm_default_args["lr_warmup_iters"] == 10

    loader = mlm.MegatronLMDummyDataLoader(
        data_path="corpus_text_document", seq_length=64, splits_string="98,2,0"
    )
    assert loader.dataset_args["megatron_dataset_flag"] is True
    fake_state = types.SimpleNamespace(megatron_lm_plugin=plugin)
    monkeypatch.setattr("accelerando.state.AcceleratorState", lambda: fake_state)
    loader.set_megatron_data_args()
    args = plugin.megatron_lm_default_args
    assert args["data_path"] == ["corpus_text_document"] and args["seq_length"] == 64
    assert plugin.megatron_dataset_flag is True and plugin.seq_length == 64

    accelerator = types.SimpleNamespace(state=fake_state)
    with pytest.raises(MegatronLMUnavailableError, match="megatron-core"):
        loader.get_train_valid_test_datasets_provider(accelerator)
    plugin.custom_megatron_datasets_provider_function = provider = lambda *a: ("train", "valid", "test")
    assert loader.get_train_valid_test_datasets_provider(accelerator) is provider
    with pytest.raises(MegatronLMUnavailableError, match="ParallelismConfig"):
        loader.build_train_valid_test_data_iterators(accelerator)


def test_loss_averaging_and_gather_in_one_process():
    losses = [torch.tensor(2.0), torch.tensor(4.0, requires_grad=True)]
    averaged = mlm.avg_losses_across_data_parallel_group(losses)
    assert torch.equal(averaged, torch.tensor([2.0, 4.0])) and not averaged.requires_grad
    nested = {"a": torch.ones(2), "b": [torch.zeros(1)]}
    assert mlm.gather_across_data_parallel_groups(nested) is not None
    assert torch.equal(mlm.gather_across_data_parallel_groups(nested)["a"], torch.ones(2))


def _gloo_worker(rank: int, world: int, port: int, queue) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        averaged = mlm.avg_losses_across_data_parallel_group([torch.tensor(float(rank)), torch.tensor(10.0)])
        gathered = mlm.gather_across_data_parallel_groups(torch.tensor([rank, rank]))
        queue.put((rank, averaged.tolist(), gathered.tolist()))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_loss_averaging_over_a_gloo_group():
    import socket

    import torch.multiprocessing as tmp

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ctx = tmp.get_context("spawn")
    queue = ctx.SimpleQueue()
    tmp.start_processes(_gloo_worker, args=(2, port, queue), nprocs=2, start_method="spawn")
    results = sorted(queue.get() for _ in range(2))
    for _, averaged, gathered in results:
        assert averaged == [0.5, 10.0]
        assert gathered == [0, 0, 1, 1]


def test_gpt_train_step_batch_loss_and_forward():
    args = types.SimpleNamespace(
        megatron_dataset_flag=False, eod_token=9, eod_mask_loss=True, reset_position_ids=True
    )
    step = mlm.GPTTrainStep(None, args)
    ids = torch.tensor([[1, 9, 3, 4, 5]])
    tokens, labels, loss_mask, attention_mask, position_ids = step.get_batch(iter([{"input_ids": ids}]))
    assert tokens.tolist() == [[1, 9, 3, 4]] and labels.tolist() == [[9, 3, 4, 5]]
    assert loss_mask.tolist() == [[1.0, 0.0, 1.0, 1.0]]
    assert position_ids.tolist() == [[0, 1, 0, 1]]
    assert (
        attention_mask.shape == (1, 1, 4, 4) and attention_mask[0, 0, 0, 1] and not attention_mask[0, 0, 1, 0]
    )

    seen = {}

    def model(tokens, position_ids, attention_mask, labels=None):
        seen["labels"] = labels
        return torch.tensor([[1.0, 100.0, 3.0, 5.0]])

    output, loss_fn = step.forward_step(iter([{"input_ids": ids}]), model)
    loss, logged = loss_fn(output)
    assert loss.item() == pytest.approx(3.0) and logged["lm loss"].item() == pytest.approx(3.0)
    assert torch.equal(seen["labels"], labels)
    # Megatron-LM's sample formats: legacy "text" (shifted like input_ids) and megatron-core's GPTDataset.
    megatron = mlm.GPTTrainStep(None, types.SimpleNamespace(megatron_dataset_flag=True, eod_token=9))
    tokens, labels, *_ = megatron.get_batch(iter([{"text": ids}]))
    assert tokens.tolist() == [[1, 9, 3, 4]] and labels.tolist() == [[9, 3, 4, 5]]
    sample = {"tokens": ids[:, :-1], "labels": ids[:, 1:], "loss_mask": torch.tensor([[1, 1, 0, 1]])}
    tokens, labels, loss_mask, mask, positions = megatron.get_batch(iter([sample]))
    assert labels.tolist() == [[9, 3, 4, 5]] and loss_mask.tolist() == [[1.0, 1.0, 0.0, 1.0]]
    assert mask.shape == (1, 1, 4, 4) and positions.tolist() == [[0, 1, 2, 3]]


def test_bert_and_t5_train_steps_over_megatron_samples():
    bert = mlm.BertTrainStep(None, types.SimpleNamespace(megatron_dataset_flag=True))
    sample = {
        "text": torch.tensor([[5, 6]]),
        "types": torch.tensor([[0, 1]]),
        "is_random": torch.tensor([1]),
        "loss_mask": torch.tensor([[0, 1]]),
        "labels": torch.tensor([[-1, 6]]),
        "padding_mask": torch.tensor([[1, 1]]),
    }
    tokens, types_, order, loss_mask, labels, padding = bert.get_batch(iter([sample]))
    assert tokens.tolist() == [[5, 6]] and types_.tolist() == [[0, 1]] and order.tolist() == [1]
    assert loss_mask.dtype == torch.float and padding.tolist() == [[1, 1]] and labels.tolist() == [[-1, 6]]
    t5 = mlm.T5TrainStep(None, types.SimpleNamespace(megatron_dataset_flag=True))
    sample = {
        "text_enc": torch.tensor([[1, 2]]),
        "text_dec": torch.tensor([[0, 3]]),
        "labels": torch.tensor([[3, 4]]),
        "loss_mask": torch.tensor([[1, 0]]),
        "enc_mask": torch.tensor([[[1, 0], [1, 1]]]),
        "dec_mask": torch.tensor([[[1, 0], [1, 1]]]),
        "enc_dec_mask": torch.tensor([[[1, 1], [0, 1]]]),
    }
    enc, dec, labels, loss_mask, enc_mask, dec_mask, cross = t5.get_batch(iter([sample]))
    assert enc.tolist() == [[1, 2]] and dec.tolist() == [[0, 3]] and loss_mask.tolist() == [[1.0, 0.0]]
    assert enc_mask.tolist() == [[[[False, True], [False, False]]]]
    assert cross.tolist() == [[[[False, False], [True, False]]]] and dec_mask.shape == (1, 1, 2, 2)


def test_bert_and_t5_train_steps():
    bert = mlm.BertTrainStep(None, types.SimpleNamespace(pretraining_flag=True, bert_binary_head=True))
    batch = {
        "input_ids": torch.tensor([[5, 6, 7]]),
        "attention_mask": torch.tensor([[1, 1, 0]]),
        "labels": torch.tensor([[-100, 6, -100]]),
        "next_sentence_label": torch.tensor([1]),
    }
    seen = {}

    def bert_model(*args, **kwargs):
        seen.update(kwargs)
        return torch.tensor([[9.0, 2.0, 9.0]]), None

    output, loss_fn = bert.forward_step(iter([batch]), bert_model)
    loss, logged = loss_fn(output)
    assert loss.item() == pytest.approx(2.0) and set(logged) == {"lm loss"}
    assert seen["tokentype_ids"].tolist() == [[0, 0, 0]]  # binary head without token_type_ids: one segment
    sop = torch.tensor([[0.0, 0.0]])
    loss, logged = loss_fn((torch.tensor([[9.0, 2.0, 9.0]]), sop))
    assert loss.item() == pytest.approx(2.0 + torch.log(torch.tensor(2.0)).item(), rel=1e-5)
    classify = mlm.BertTrainStep(None, types.SimpleNamespace(pretraining_flag=False, num_labels=1)).loss_func
    assert classify(torch.tensor([1.0, 3.0]), torch.tensor([[2.0], [3.0]]))[0].item() == pytest.approx(0.5)

    t5 = mlm.T5TrainStep(None, types.SimpleNamespace())
    tokens_enc, tokens_dec, labels, loss_mask, enc, dec, cross = t5.get_batch(
        iter([{"input_ids": torch.tensor([[4, 5, 1]]), "attention_mask": torch.tensor([[1, 1, 0]]),
               "labels": torch.tensor([[7, 8, -100]])}])
    )  # fmt: skip
    assert tokens_dec.tolist() == [[0, 7, 8]] and loss_mask.tolist() == [[1.0, 1.0, 0.0]]
    assert enc.shape == (1, 1, 3, 3) and dec.shape == (1, 1, 3, 3) and cross.shape == (1, 1, 3, 3)
    with pytest.raises(NotImplementedError, match="get_batch_func"):
        mlm.AbstractTrainStep("x").get_batch_func(None, False)


def test_network_arguments_from_a_transformers_config():
    from transformers import GPT2Config, GPT2LMHeadModel

    from accelerando.plugins.megatron import MegatronLMPlugin
    from accelerando.plugins.megatron_parsers import parse_model_config

    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=4, n_positions=64, vocab_size=100))
    plugin = MegatronLMPlugin()
    parse_model_config(plugin, model, {"input_ids": torch.zeros(2, 16, dtype=torch.long)})
    args = plugin.megatron_lm_default_args
    assert (args["num_layers"], args["hidden_size"], args["num_attention_heads"]) == (2, 32, 4)
    assert args["max_position_embeddings"] == 64 and args["seq_length"] == 16
    with pytest.raises(ValueError, match="No Megatron-LM parser"):
        parse_model_config(plugin, types.SimpleNamespace(config=types.SimpleNamespace(model_type="nope")))


def test_optimizer_and_scheduler_wrappers_leave_stepping_to_the_engine():
    parameter = torch.nn.Parameter(torch.ones(1))
    optimizer = torch.optim.SGD([parameter], lr=1.0)
    parameter.grad = torch.ones(1)
    wrapped = mlm.MegatronLMOptimizerWrapper(optimizer)
    wrapped.step()
    wrapped.zero_grad()
    assert parameter.item() == 1.0 and parameter.grad is not None and not wrapped.step_was_skipped
    optimizer.skipped_iter = True
    assert wrapped.step_was_skipped
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    mlm.MegatronLMSchedulerWrapper(scheduler, wrapped).step()
    assert optimizer.param_groups[0]["lr"] == 1.0


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_megatron_core_parts_refuse_clearly():
    from accelerando.backends.strategies.megatron.requirements import megatron_core_missing

    # These need CUDA (megatron-core's RNG tracker, DDP buffers, kernels) and refuse here either way.
    calls = [
        lambda: mlm.initialize(None),
        mlm.finish_mpu_init,
        lambda: mlm.prepare_model_optimizer_scheduler(None),
        lambda: mlm.prepare_optimizer(None, None),
        lambda: mlm.MegatronEngine(None, None, None, None),
    ]
    if megatron_core_missing():
        # These run on the CPU with megatron-core (see test_megatron_core_cpu.py); without it they refuse.
        calls += [
            mlm.model_provider_func,
            lambda: mlm.prepare_data_loader(None, None),
            lambda: mlm.prepare_scheduler(None, None, None),
        ]
    for call in calls:
        with pytest.raises(MegatronLMUnavailableError) as info:
            call()
        message = str(info.value)
        assert "megatron-core" in message and "CUDA" in message
        assert "ParallelismConfig(tp_size=...)" in message and "PipelineParallelPlugin" in message
