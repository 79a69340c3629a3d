"""One Hugging Face client scenario on accelerando standing in for ``accelerate`` (run as a script).

Run by the tests in this folder in a fresh interpreter, directly (1 process) or under
``accelerando launch --num_processes 2``. It installs the stand-in before anything imports
transformers, then:

1. trains a tiny model from scratch for ``--steps`` optimizer steps, saving a checkpoint every
   ``--save_every`` steps, and evaluates it (run "A");
2. with ``--resume``: builds the same trainer again and resumes from A's first checkpoint (run "B");
3. writes what it observed to ``<out>/result-rank<N>.json`` (the tests assert on it): which
   ``Accelerator`` class ran, losses, metrics, checkpoint files, and the largest difference between
   A's and B's final weights.

``--client trainer`` uses ``transformers.Trainer``; ``--client sft`` uses ``trl.SFTTrainer``;
``--client reward`` trl's ``RewardTrainer`` (a sequence-classification head) and ``--client dpo`` trl's
``DPOTrainer`` (its reference model a copy), both on preference pairs made here;
``--lora`` wraps the model with a peft LoRA adapter; ``--deepspeed FILE`` / ``--fsdp SPEC`` pass
the trainer's own options. ``--auto_find_batch_size`` sets ``TrainingArguments(auto_find_batch_size=True)``
and ``--oom_above N`` makes every forward of a batch above N samples raise the out-of-memory error a
GPU would; the result then records each start and completion of the training loop (a callback). ``--accelerate reference`` skips the stand-in (the real accelerate runs;
used by the benchmark and the parity tests; ``--weights`` saves the final weights to
``<out>/weights-rank<N>.pt`` for them). ``--epochs N`` trains whole epochs instead of ``--steps``. ``--eval_only`` evaluates the freshly built (seeded)
model on ``--eval_samples`` rows with ``--eval_batch`` per device, and stops there.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from typing import Any

VOCAB, SEQ = 128, 16


def _parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--client", choices=["trainer", "sft", "reward", "dpo"], default="trainer")
    p.add_argument("--epochs", type=int, default=0, help="train whole epochs (max_steps unset)")
    p.add_argument("--weights", action="store_true", help="save the final weights for a comparison")
    p.add_argument("--model", choices=["llama", "gpt2"], default="llama")
    p.add_argument("--accelerate", choices=["accelerando", "reference"], default="accelerando")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--save_every", type=int, default=3)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--grad_accum", type=int, default=1)
    p.add_argument("--samples", type=int, default=64)
    p.add_argument("--bf16", action="store_true")
    p.add_argument("--lora", action="store_true")
    p.add_argument("--deepspeed", default=None, help="a DeepSpeed JSON config file")
    p.add_argument("--fsdp", default=None, help="TrainingArguments.fsdp, e.g. 'full_shard auto_wrap'")
    p.add_argument("--resume", action="store_true")
    p.add_argument("--no_eval", action="store_true")
    p.add_argument("--eval_only", action="store_true", help="evaluate the untrained model, nothing else")
    p.add_argument("--eval_samples", type=int, default=16)
    p.add_argument("--eval_batch", type=int, default=None, help="per-device eval batch (default --batch)")
    p.add_argument("--auto_find_batch_size", action="store_true")
    p.add_argument("--oom_above", type=int, default=0, help="forwards of larger batches raise OOM")
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--layers", type=int, default=2)
    return p.parse_args(argv)


def _model(args: argparse.Namespace) -> Any:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaForCausalLM

    torch.manual_seed(0)
    if args.model == "gpt2":
        config = GPT2Config(
            vocab_size=VOCAB, n_embd=args.hidden, n_layer=args.layers, n_head=4, n_positions=64
        )
        model = GPT2LMHeadModel(config)
    elif args.client == "reward":
        from transformers import LlamaForSequenceClassification

        model = LlamaForSequenceClassification(_llama_config(args, num_labels=1, pad_token_id=0))
    else:
        model = LlamaForCausalLM(_llama_config(args))
    if args.lora:
        from peft import LoraConfig, get_peft_model

        targets = ["c_attn"] if args.model == "gpt2" else ["q_proj", "v_proj"]
        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=targets, lora_dropout=0.0))
    return model


def _llama_config(args: argparse.Namespace, **extra: Any) -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=args.hidden,
        intermediate_size=2 * args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        **extra,
    )


def _pairs(n: int, seed: int, prompt: bool) -> Any:
    """Preference pairs of made-up words: chosen and rejected completions (after a prompt for DPO)."""
    from datasets import Dataset

    rows = _tokens(3 * n, seed).clamp(min=3).view(n, 3, SEQ)

    def text(row: Any, k: int) -> str:
        return " ".join(f"w{int(t)}" for t in row[:k])

    data: dict[str, list[str]] = {
        "chosen": [text(r[1], 6) for r in rows],
        "rejected": [text(r[2], 5) for r in rows],
    }
    if prompt:
        data["prompt"] = [text(r[0], 4) for r in rows]
    return Dataset.from_dict(data)


def _tokens(n: int, seed: int) -> Any:
    import torch

    return torch.randint(0, VOCAB, (n, SEQ), generator=torch.Generator().manual_seed(seed))


class _Tokens:
    """A map-style dataset of fixed random token rows (input_ids == labels)."""

    def __init__(self, n: int, seed: int) -> None:
        self.rows = _tokens(n, seed)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"input_ids": self.rows[i], "labels": self.rows[i]}


def _tokenizer() -> Any:
    """A word-level tokenizer over VOCAB made-up words, built here (nothing downloaded)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2} | {f"w{i}": i for i in range(3, VOCAB)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    )


def _text_dataset(n: int, seed: int) -> Any:
    from datasets import Dataset

    rows = _tokens(n, seed).clamp(min=3)
    return Dataset.from_dict({"text": [" ".join(f"w{int(t)}" for t in row) for row in rows]})


def _training_args(args: argparse.Namespace, out: str) -> Any:
    common: dict[str, Any] = dict(
        output_dir=out,
        per_device_train_batch_size=args.batch,
        per_device_eval_batch_size=args.eval_batch or args.batch,
        gradient_accumulation_steps=args.grad_accum,
        max_steps=args.steps,
        save_steps=args.save_every,
        save_strategy="steps",
        logging_steps=1,
        learning_rate=1e-3,
        report_to=[],
        # DeepSpeed and FSDP need the default device (CPU here): use_cpu would turn them off.
        use_cpu=not (args.deepspeed or args.fsdp),
        seed=0,
        data_seed=0,
        bf16=args.bf16,
        eval_strategy="no",
        dataloader_num_workers=0,
        disable_tqdm=True,
        auto_find_batch_size=args.auto_find_batch_size,
    )
    if args.deepspeed:
        common["deepspeed"] = args.deepspeed
    if args.fsdp:
        common["fsdp"] = args.fsdp
        common["fsdp_config"] = {"min_num_params": 0, "state_dict_type": "FULL_STATE_DICT"}
    if args.epochs:
        common.update(max_steps=-1, num_train_epochs=args.epochs)
    if args.client == "sft":
        from trl import SFTConfig

        return SFTConfig(max_length=SEQ + 2, packing=False, **common)
    if args.client == "reward":
        from trl import RewardConfig

        return RewardConfig(max_length=SEQ, **common)
    if args.client == "dpo":
        from trl import DPOConfig

        return DPOConfig(max_length=SEQ, **common)
    from transformers import TrainingArguments

    return TrainingArguments(**common)


def _trainer(args: argparse.Namespace, out: str) -> Any:
    model = _model(args)
    training_args = _training_args(args, out)
    if args.client == "sft":
        from trl import SFTTrainer

        return SFTTrainer(
            model=model,
            args=training_args,
            train_dataset=_text_dataset(args.samples, 1),
            eval_dataset=_text_dataset(args.eval_samples, 2),
            processing_class=_tokenizer(),
        )
    if args.client in ("reward", "dpo"):
        import copy

        from trl import DPOTrainer, RewardTrainer

        extra = {"ref_model": copy.deepcopy(model)} if args.client == "dpo" else {}
        cls = RewardTrainer if args.client == "reward" else DPOTrainer
        return cls(
            model=model,
            **extra,
            args=training_args,
            train_dataset=_pairs(args.samples, 1, args.client == "dpo"),
            eval_dataset=_pairs(args.eval_samples, 2, args.client == "dpo"),
            processing_class=_tokenizer(),
        )
    from transformers import Trainer

    return Trainer(
        model=model,
        args=training_args,
        train_dataset=_Tokens(args.samples, 1),
        eval_dataset=_Tokens(args.eval_samples, 2),
    )


def _watch_training_loop(trainer: Any, args: argparse.Namespace, seen: dict[str, list[int]]) -> None:
    """Record each start (with its batch size) and end of the training loop; simulate OOM if asked."""
    from transformers import TrainerCallback

    class _LoopCounter(TrainerCallback):
        def on_train_begin(self, _args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            seen["begin"].append(state.train_batch_size)

        def on_train_end(self, _args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            seen["end"].append(state.train_batch_size)

    trainer.add_callback(_LoopCounter())
    if not args.oom_above:
        return
    import torch

    def _oom(_module: Any, inputs: tuple, kwargs: dict[str, Any]) -> None:
        batch = kwargs.get("input_ids", inputs[0] if inputs else None)
        if batch is not None and batch.shape[0] > args.oom_above:
            raise torch.OutOfMemoryError(f"CUDA out of memory. (simulated: a batch of {batch.shape[0]})")

    trainer.model.register_forward_pre_hook(_oom, with_kwargs=True)


def _final_weights(trainer: Any) -> dict[str, Any]:
    """Every process's full copy of the trained weights (gathered for ZeRO-3 / FSDP), on CPU, fp32."""
    wrapped = trainer.model_wrapped if trainer.model_wrapped is not None else trainer.model
    state = trainer.accelerator.get_state_dict(wrapped, unwrap=True)
    return {k: v.detach().float().cpu().clone() for k, v in (state or {}).items()}


def _max_diff(a: dict[str, Any], b: dict[str, Any]) -> tuple[float | None, bool | None]:
    if not a and not b:
        # Full state dicts of sharded models (FSDP1 FULL_STATE_DICT, ZeRO-3's 16-bit gather) are
        # gathered on the main process only; the others have nothing to compare.
        return None, None
    if set(a) != set(b) or not a:
        return math.inf, False
    worst, same = 0.0, True
    for k in a:
        diff = (a[k] - b[k]).abs().max().item() if a[k].numel() else 0.0
        worst = max(worst, diff)
        same = same and bool((a[k] == b[k]).all())
    return worst, same


def _losses(trainer: Any) -> dict[int, float]:
    return {e["step"]: e["loss"] for e in trainer.state.log_history if "loss" in e}


def main(argv: list[str] | None = None) -> int:
    """Run the scenario; returns the exit status."""
    args = _parse(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    if args.accelerate == "accelerando":
        from accelerando.core.stand_in import install_as_accelerate

        install_as_accelerate()

    import torch

    torch.set_num_threads(1)
    result: dict[str, Any] = {"args": vars(args)}
    out_a = os.path.join(args.out, "run_a")
    trainer = _trainer(args, out_a)
    acc = trainer.accelerator
    rank = acc.process_index
    result.update(
        rank=rank,
        world=acc.num_processes,
        accelerator_module=type(acc).__module__,
        accelerate_module=type(sys.modules["accelerate"]).__module__,
        accelerate_version=sys.modules["accelerate"].__version__,
        mixed_precision=str(acc.mixed_precision),
        gradient_accumulation_steps=acc.gradient_accumulation_steps,
        distributed_type=str(acc.distributed_type),
    )
    if args.eval_only:
        result["eval_a"] = trainer.evaluate()
        with open(os.path.join(args.out, f"result-rank{rank}.json"), "w") as fh:
            json.dump(result, fh, indent=1, default=str)
        return 0
    dtypes: list[str] = []
    head = trainer.model.get_output_embeddings() or getattr(trainer.model, "score", None)
    handle = head.register_forward_hook(lambda _m, _i, o: dtypes.append(str(o.dtype)))
    loop: dict[str, list[int]] = {"begin": [], "end": []}
    _watch_training_loop(trainer, args, loop)
    start = time.perf_counter()
    train_out = trainer.train()
    result["train_seconds"] = time.perf_counter() - start
    handle.remove()
    result.update(
        global_step=train_out.global_step,
        train_loss=train_out.training_loss,
        losses_a=_losses(trainer),
        head_output_dtypes=sorted(set(dtypes)),
        steps_per_second=train_out.metrics.get("train_steps_per_second"),
        loop_begins=loop["begin"],
        loop_ends=loop["end"],
    )
    if not args.no_eval:
        result["eval_a"] = trainer.evaluate()
    checkpoints = sorted(d for d in os.listdir(out_a) if d.startswith("checkpoint-"))
    result["checkpoints"] = {d: sorted(os.listdir(os.path.join(out_a, d))) for d in checkpoints}
    weights_a = _final_weights(trainer)
    if args.weights:
        torch.save(weights_a, os.path.join(args.out, f"weights-rank{rank}.pt"))
    result["trainable_a"] = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)

    if args.resume:
        del trainer
        out_b = os.path.join(args.out, "run_b")
        first = os.path.join(out_a, f"checkpoint-{args.save_every}")
        trainer_b = _trainer(args, out_b)
        result["accelerator_module_b"] = type(trainer_b.accelerator).__module__
        train_b = trainer_b.train(resume_from_checkpoint=first)
        result.update(global_step_b=train_b.global_step, losses_b=_losses(trainer_b))
        if not args.no_eval:
            result["eval_b"] = trainer_b.evaluate()
        worst, same = _max_diff(weights_a, _final_weights(trainer_b))
        result.update(resume_max_abs_diff=worst, resume_bitwise=same)

    with open(os.path.join(args.out, f"result-rank{rank}.json"), "w") as fh:
        json.dump(result, fh, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
