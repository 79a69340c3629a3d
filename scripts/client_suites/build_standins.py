"""Build offline stand-ins for the Hub repositories trl's test suite loads (issue 40 item 7).

    python scripts/client_suites/build_standins.py TRL_CHECKOUT OUT_DIR

Nothing is downloaded. Three steps:

1. Datasets: trl's own generation scripts (``scripts/generate_zen_dataset.py`` and friends) run with
   ``push_to_hub=True`` while ``DatasetDict.push_to_hub`` is replaced by a writer that lays the parquet files and the
   README's ``configs:`` block out under ``OUT_DIR/datasets/<repo_id>`` exactly as the Hub would; the test run's
   ``hub_redirect`` plugin points ``load_dataset("<repo_id>", ...)`` at that folder.
2. Source tokenizers: trl's tiny-model scripts start from the real model's tokenizer and generation config. Those
   are replaced by small byte-level BPE tokenizers trained here on the zen texts and trl's chat templates, carrying
   the real model's special tokens and its exact chat template (trl ships the templates it recognises), written into
   the Hub cache layout (``OUT_DIR/hf/hub/models--org--name``).
3. Tiny models: trl's ``scripts/generate_tiny_models`` scripts run unchanged except that the helpers which read the
   real model from the Hub (dtype and config diffs, the version pin) become no-ops and ``push_to_hub`` saves into
   the Hub cache layout instead.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import runpy
import shutil
import sys
import tempfile

TEMPLATES = {  # source repo -> (trl chat template file, tokenizer flavour, extra config)
    "Qwen/Qwen2.5-32B-Instruct": (
        "qwen2_5.jinja",
        "qwen2.5",
        {"model_type": "qwen2", "num_hidden_layers": 64},
    ),
    "Qwen/Qwen3-8B": ("qwen3.jinja", "qwen3", {"model_type": "qwen3", "num_hidden_layers": 36}),
    "Qwen/Qwen3-4B": ("qwen3.jinja", "qwen3", {"model_type": "qwen3", "num_hidden_layers": 36}),
    "Qwen/Qwen3-30B-A3B": ("qwen3.jinja", "qwen3", {"model_type": "qwen3_moe", "num_hidden_layers": 48}),
    "Qwen/Qwen3-4B-Instruct-2507": ("qwen3_instruct_2507.jinja", "qwen3", {"model_type": "qwen3"}),
    "meta-llama/Meta-Llama-3-8B-Instruct": ("llama3.jinja", "llama3", {"model_type": "llama"}),
    "meta-llama/Llama-3.1-8B-Instruct": ("llama3_1.jinja", "llama3", {"model_type": "llama"}),
    "meta-llama/Llama-3.2-1B-Instruct": (
        "llama3_2.jinja",
        "llama3",
        {"model_type": "llama", "num_hidden_layers": 16},
    ),
}
MODEL_SCRIPTS = [  # trl's scripts, run in this order (the PEFT ones load tiny-Qwen3ForCausalLM)
    "for_causal_lm.qwen2_for_causal_lm_2_5",
    "for_causal_lm.small_qwen2_for_causal_lm_2_5",
    "for_causal_lm.qwen3_for_causal_lm",
    "for_causal_lm.small_qwen3_for_causal_lm",
    "for_causal_lm.qwen3_for_causal_lm_instruct_2507",
    "for_causal_lm.qwen3_moe_for_causal_lm",
    "for_causal_lm.llama_for_causal_lm_3",
    "for_causal_lm.llama_for_causal_lm_3_1",
    "for_causal_lm.llama_for_causal_lm_3_2",
    "for_causal_lm.peft_qwen3_for_causal_lm",
    "for_causal_lm.peft_qwen3_for_causal_lm_2",
    "for_sequence_classification.qwen2_for_sequence_classification_2_5",
    "for_sequence_classification.qwen3_for_sequence_classification",
    "for_sequence_classification.qwen3_moe_for_sequence_classification",
    "for_sequence_classification.llama_for_sequence_classification_3_2",
]
DATASET_SCRIPTS = ["generate_zen_dataset.py", "generate_toolcall_dataset.py", "generate_harmony_dataset.py"]
SPECIALS = {
    "qwen2.5": [
        "<|endoftext|>",
        "<|im_start|>",
        "<|im_end|>",
        "<|object_ref_start|>",
        "<|object_ref_end|>",
        "<|box_start|>",
        "<|box_end|>",
        "<|quad_start|>",
        "<|quad_end|>",
        "<|vision_start|>",
        "<|vision_end|>",
        "<|vision_pad|>",
        "<|image_pad|>",
        "<|video_pad|>",
    ],
    "llama3": [
        "<|begin_of_text|>",
        "<|end_of_text|>",
        "<|finetune_right_pad_id|>",
        "<|start_header_id|>",
        "<|end_header_id|>",
        "<|eom_id|>",
        "<|eot_id|>",
        "<|python_tag|>",
    ],
}
SPECIALS["qwen3"] = SPECIALS["qwen2.5"]
NON_SPECIAL = {
    "qwen2.5": ["<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>"],
    "qwen3": ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"],
    "llama3": [],
}


def cache_put(
    hub: pathlib.Path, repo_id: str, folder: pathlib.Path, refs: tuple[str, ...] = ("main",)
) -> None:
    """Copy ``folder``'s files into the Hub cache layout as one snapshot of ``repo_id``."""
    repo_dir = hub / ("models--" + repo_id.replace("/", "--"))
    sha = hashlib.sha1(repo_id.encode()).hexdigest()
    snap = repo_dir / "snapshots" / sha
    if snap.exists():
        shutil.rmtree(snap)
    shutil.copytree(folder, snap)
    for ref in refs:
        (repo_dir / "refs" / ref).parent.mkdir(parents=True, exist_ok=True)
        (repo_dir / "refs" / ref).write_text(sha)


def corpus(trl_root: pathlib.Path, templates: pathlib.Path) -> list[str]:
    """Texts to train the stand-in tokenizers on: trl's test sources, its chat templates and the Zen of Python."""
    texts = [p.read_text(errors="ignore") for p in sorted((trl_root / "tests").glob("test_*.py"))]
    texts += [p.read_text() for p in sorted(templates.glob("*.jinja"))]
    return texts


def train_bpe(texts: list[str], specials: list[str], vocab_size: int = 3000):
    """A byte-level BPE trained on ``texts`` with ``specials`` as its first ids."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    return tok


def build_tokenizer(flavour: str, template: str, texts: list[str]):
    """The stand-in tokenizer of one model family (Qwen2Tokenizer for Qwen, a fast tokenizer for Llama 3)."""
    from tokenizers import AddedToken, processors
    from transformers import PreTrainedTokenizerFast, Qwen2Tokenizer

    bpe = train_bpe(texts, SPECIALS[flavour])
    if flavour.startswith("qwen"):
        state = json.loads(bpe.to_str())["model"]
        merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in state["merges"]]
        tok = Qwen2Tokenizer(
            vocab=state["vocab"],
            merges=merges,
            eos_token="<|im_end|>",
            pad_token="<|endoftext|>",
            unk_token=None,
            model_max_length=131072,
        )
        tok.add_special_tokens({"additional_special_tokens": SPECIALS[flavour][1:]})
    else:
        bpe.post_processor = processors.TemplateProcessing(
            single="<|begin_of_text|> $A",
            pair="<|begin_of_text|> $A <|begin_of_text|> $B",
            special_tokens=[("<|begin_of_text|>", bpe.token_to_id("<|begin_of_text|>"))],
        )
        tok = PreTrainedTokenizerFast(
            tokenizer_object=bpe,
            bos_token="<|begin_of_text|>",
            eos_token="<|eot_id|>",
            model_max_length=131072,
        )
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in NON_SPECIAL[flavour]])
    tok.chat_template = template
    return tok


def build_source_repos(hub: pathlib.Path, trl_root: pathlib.Path) -> None:
    """Stand-ins for the real models' tokenizer, generation config and config the tiny-model scripts start from."""
    import trl
    from transformers import GenerationConfig

    templates = pathlib.Path(trl.__file__).parent / "chat_templates"
    texts = corpus(trl_root, templates)
    for repo_id, (template_file, flavour, config) in TEMPLATES.items():
        tok = build_tokenizer(flavour, (templates / template_file).read_text(), texts)
        with tempfile.TemporaryDirectory() as tmp:
            tok.save_pretrained(tmp)
            eos = [
                tok.convert_tokens_to_ids(t)
                for t in ("<|im_end|>", "<|endoftext|>", "<|eot_id|>")
                if t in tok.get_vocab()
            ]
            bos = tok.convert_tokens_to_ids("<|begin_of_text|>") if flavour == "llama3" else tok.pad_token_id
            GenerationConfig(
                bos_token_id=bos,
                eos_token_id=eos,
                pad_token_id=tok.pad_token_id,
                do_sample=True,
                temperature=0.7,
                top_p=0.8,
                top_k=20,
            ).save_pretrained(tmp)
            cfg = {
                "architectures": [],
                "vocab_size": len(tok),
                "tie_word_embeddings": flavour == "llama3",
                **config,
            }
            pathlib.Path(tmp, "config.json").write_text(json.dumps(cfg, indent=2))
            cache_put(hub, repo_id, pathlib.Path(tmp), refs=("main", "refs/pr/14"))
        print(f"source stand-in {repo_id}: {len(tok)} tokens, template {template_file}")


def fake_dataset_push(root: pathlib.Path):
    """A ``DatasetDict.push_to_hub`` that writes the Hub's file layout under ``root/<repo_id>``."""

    def push(self, repo_id: str, config_name: str = "default", **_: object) -> None:
        repo = root / repo_id
        configs = (
            json.loads((repo / ".configs.json").read_text()) if (repo / ".configs.json").exists() else {}
        )
        for split, ds in self.items():
            (repo / config_name).mkdir(parents=True, exist_ok=True)
            ds.to_parquet(str(repo / config_name / f"{split}-00000-of-00001.parquet"))
        configs[config_name] = sorted(self.keys())
        (repo / ".configs.json").write_text(json.dumps(configs))
        lines = ["---", "configs:"]
        for name, splits in configs.items():
            lines += [f"- config_name: {name}", "  data_files:"]
            lines += [f"  - split: {s}\n    path: {name}/{s}-*" for s in splits]
        (repo / "README.md").write_text("\n".join(lines + ["---", ""]))

    return push


def build_datasets(root: pathlib.Path, trl_root: pathlib.Path) -> None:
    """Run trl's dataset-generation scripts with pushes written locally."""
    import datasets

    datasets.DatasetDict.push_to_hub = fake_dataset_push(root)
    for script in DATASET_SCRIPTS:
        path = trl_root / "scripts" / script
        if path.exists():
            sys.argv = [str(path), "--push_to_hub", "True"]
            runpy.run_path(str(path), run_name="__main__")
            print(f"datasets from {script}")


def build_models(hub: pathlib.Path, trl_root: pathlib.Path) -> None:
    """Run trl's tiny-model scripts with the Hub-reading helpers stubbed and pushes saved into the cache."""
    sys.path.insert(0, str(trl_root))
    import scripts.generate_tiny_models._common as common  # noqa: PLC0415  (trl's checkout)

    def push_to_hub(model, tokenizer, generation_config, prefix=None, suffix=None, create_pr=None):
        name = model.__class__.__name__ if prefix is None else f"{prefix}-{model.__class__.__name__}"
        repo_id = f"{common.ORGANIZATION}/{name}" + (f"-{suffix}" if suffix else "")
        with tempfile.TemporaryDirectory() as tmp:
            model.save_pretrained(tmp)
            for extra in (tokenizer, generation_config):
                if extra is not None:
                    extra.save_pretrained(tmp)
            cache_put(hub, repo_id, pathlib.Path(tmp))
        print(f"tiny model {repo_id}")

    common.check_transformers_version = lambda *a, **k: None
    common.check_dtype_pattern = lambda *a, **k: None
    common.print_config_diff = lambda *a, **k: None
    common.push_to_hub = push_to_hub
    for module in MODEL_SCRIPTS:
        sys.argv = [module]
        runpy.run_module(f"scripts.generate_tiny_models.{module}", run_name="__main__")


def main() -> None:
    """Entry point: ``build_standins.py TRL_CHECKOUT OUT_DIR``."""
    trl_root, out = (pathlib.Path(a).resolve() for a in sys.argv[1:3])
    hub = out / "hf" / "hub"
    hub.mkdir(parents=True, exist_ok=True)
    os.environ.update(HF_HOME=str(out / "hf"), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    build_datasets(out / "datasets", trl_root)
    build_source_repos(hub, trl_root)
    build_models(hub, trl_root)


if __name__ == "__main__":
    main()
