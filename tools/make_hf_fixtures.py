"""Tiny random-weight Hugging Face checkpoints of every family, with transformers' own outputs (dev only).

    /work/venvs/hf/bin/python tools/make_hf_fixtures.py [--out tests/fixtures/models]

Needs torch and transformers (a dev environment: ``pip install torch transformers safetensors``);
CI and the tests need neither: they read what this writes, committed under
``tests/fixtures/models/<variant>/``:

    config.json, model.safetensors (or shards + model.safetensors.index.json)   save_pretrained's
    tokenizer.json, tokenizer_config.json or chat_template.jinja                a byte-level BPE of 262 tokens
    reference.json   {"prompts": [[ids]], "greedy": [[ids]], "transformers": version, "dtype": ...}
    logits.npy       float16 [prompts, positions, vocab]: transformers' fp32 logits of each prompt

Weights are drawn at a scale that keeps activations O(1) (transformers' init of std 0.02 leaves
near-tied logits, where any two fp32 implementations may pick different greedy tokens), stored in
the variant's dtype, and the reference is computed by the model loaded back from disk in float32
with eager attention; the greedy tokens recompute the whole sequence each step (no cache).
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import numpy as np

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "models"
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = [("Ġ", "t"), ("h", "e"), ("Ġt", "he")]
TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'system' and not loop.first %}{{ raise_exception('system first') }}{% endif %}"
    "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if tools %}<|im_start|>tools\n{% for t in tools %}{{ t['name'] }}{% if not loop.last %}, {% endif %}{% endfor %}<|im_end|>\n{% endif %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
COMMON = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              vocab_size=262, max_position_embeddings=512, bos_token_id=1, eos_token_id=2, pad_token_id=0)
VARIANTS = {
    "llama": ("LlamaConfig", "float32", dict(head_dim=16)),
    "llama3": ("LlamaConfig", "bfloat16", dict(
        head_dim=16, attention_bias=True, mlp_bias=True, tie_word_embeddings=True,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
    )),
    "mistral": ("MistralConfig", "bfloat16", dict(head_dim=16, sliding_window=8)),
    "qwen2": ("Qwen2Config", "bfloat16", dict(rope_theta=1000000.0)),
    "qwen3": ("Qwen3Config", "float16", dict(head_dim=32)),
    "gemma3": ("Gemma3TextConfig", "bfloat16", dict(
        head_dim=16, num_key_value_heads=1, sliding_window=8, layer_types=["sliding_attention", "full_attention"],
        query_pre_attn_scalar=24, rope_theta=1000000.0, rope_local_base_freq=10000.0, hidden_activation="gelu_pytorch_tanh",
    )),
    "phi3": ("Phi3Config", "float32", dict(num_key_value_heads=4, sliding_window=16)),
}
SHARDED = {"llama3"}
"""Variants saved in shards (with model.safetensors.index.json)."""
PROMPTS = [[5, 40, 41, 42, 7, 40, 41, 42, 9, 100, 101, 102, 103, 40, 41, 42, 7, 12, 13, 14], [200, 3, 77, 150, 150, 150, 33, 61]]
NEW_TOKENS = 16


def tokenizer_files(out: Path, template_in_config: bool) -> None:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    from transformers.convert_slow_tokenizer import bytes_to_unicode

    alphabet = bytes_to_unicode()  # GPT-2's byte -> character map, as sf_trt's tokenizer reads it
    pieces = SPECIALS + [alphabet[b] for b in range(256)] + ["".join(m) for m in MERGES]
    tok = Tokenizer(models.BPE(vocab={p: i for i, p in enumerate(pieces)}, merges=MERGES, fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS])
    tok.save(str(out / "tokenizer.json"))
    config = {"bos_token": SPECIALS[1], "eos_token": SPECIALS[2], "tokenizer_class": "PreTrainedTokenizerFast"}
    if template_in_config:
        config["chat_template"] = TEMPLATE
    else:
        (out / "chat_template.jinja").write_text(TEMPLATE)
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")


def randomize(model, seed: int) -> None:
    """Weights at a scale that keeps activations O(1): matrices N(0, 1/in) (the blocks' output
    projections N(0, 16/in)), embeddings N(0, 1) (tied: N(0, 0.01), so that the lm_head does not
    just repeat the last token; Gemma's divided by sqrt(hidden) more), norms 1 + N(0, 0.1) (Gemma's, stored as w in
    (1 + w): N(0, 0.1)), biases N(0, 0.1)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    gemma = "Gemma" in type(model).__name__
    tied = model.config.tie_word_embeddings
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            if "norm" in name:
                p.copy_(noise * 0.1 + (0.0 if gemma else 1.0))
            elif name.endswith("bias"):
                p.copy_(noise * 0.1)
            elif "embed" in name:
                # a tied lm_head favours the last token in proportion to its row's share of the stream;
                # Gemma's rows are scaled by sqrt(hidden)
                p.copy_(noise * (0.1 if tied else 1.0) / (p.shape[-1] ** 0.5 if gemma else 1.0))
            elif "o_proj" in name or "down_proj" in name:
                p.copy_(noise * 4.0 / p.shape[-1] ** 0.5)  # blocks that outweigh a tied embedding's own row
            else:
                p.copy_(noise / p.shape[-1] ** 0.5)


def make(variant: str, out: Path) -> None:
    import torch
    import transformers

    cls_name, dtype, extra = VARIANTS[variant]
    config = getattr(transformers, cls_name)(**{**COMMON, **extra})
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=torch.float32)
    randomize(model, seed=sum(map(ord, variant)))
    model.to(getattr(torch, dtype))
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    model.save_pretrained(out, max_shard_size="100KB" if variant in SHARDED else "50GB")
    (out / "generation_config.json").unlink(missing_ok=True)
    tokenizer_files(out, template_in_config=variant in ("llama", "qwen2", "gemma3"))
    ref = transformers.AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager", dtype=torch.float32).eval()
    logits, greedy = [], []
    with torch.no_grad():
        for prompt in PROMPTS:
            ids = torch.tensor([prompt])
            logits.append(ref(ids).logits[0].float().numpy())
            seq = list(prompt)
            for _ in range(NEW_TOKENS):
                seq.append(int(ref(torch.tensor([seq])).logits[0, -1].argmax()))
            greedy.append(seq[len(prompt):])
    n = max(len(p) for p in PROMPTS)
    stacked = np.zeros((len(PROMPTS), n, config.vocab_size), np.float16)
    for i, rows in enumerate(logits):
        stacked[i, : len(rows)] = rows
    np.save(out / "logits.npy", stacked)
    meta = {"prompts": PROMPTS, "greedy": greedy, "transformers": transformers.__version__, "torch": torch.__version__, "dtype": dtype}
    (out / "reference.json").write_text(json.dumps(meta, indent=1) + "\n")
    size = sum(p.stat().st_size for p in out.iterdir())
    print(f"{variant}: {out} ({size / 1024:.0f} KiB), greedy {greedy}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("variants", nargs="*", default=list(VARIANTS))
    args = p.parse_args()
    for v in args.variants:
        make(v, args.out / v)


if __name__ == "__main__":
    main()
