"""A tiny Llama written as a real GGUF file (with a byte-level vocabulary and a chat template), for tests."""

from __future__ import annotations

import dataclasses

import numpy as np
from sf_trt.export.tiny import random_llama_weights, tiny_llama_config

from sf_trt.formats.model_dir import LlamaConfig


def _byte_pieces() -> list[str]:
    from sf_trt.tokenizer.byte_level import byte_alphabet

    table = byte_alphabet()
    return [table[b] for b in range(256)]


SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


MERGES = ["Ġ t", "h e", "Ġt he"]


TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"


def write_tiny_gguf(
    path, *, arch="llama", seed=0, bad_type=None, context_length=512, template=TEMPLATE, meta=None, tensor_fn=None,
) -> tuple[LlamaConfig, object]:
    """The tiny random Llama as a GGUF at ``path``; ``(cfg, weights)``.

    ``meta`` overrides metadata as written (``{"block_count": 10**9}``: the
    GGUF then says what its tensors are not); ``tensor_fn(name, array)`` may
    change a tensor before it is written."""
    import gguf

    tokens = SPECIALS + _byte_pieces() + ["Ġt", "he", "Ġthe"]
    cfg = tiny_llama_config(vocab=len(tokens), bos=1, eos=2, context_length=context_length)
    weights = random_llama_weights(cfg, seed)
    said = {"context_length": cfg.context_length, "embedding_length": cfg.hidden, "block_count": cfg.n_layers,
            "feed_forward_length": cfg.ffn, "head_count": cfg.n_heads, "head_count_kv": cfg.n_kv_heads,
            "rope_dimension_count": cfg.head_dim, **(meta or {})}
    w = gguf.GGUFWriter(str(path), arch)
    w.add_context_length(said["context_length"])
    w.add_embedding_length(said["embedding_length"])
    w.add_block_count(said["block_count"])
    w.add_feed_forward_length(said["feed_forward_length"])
    w.add_head_count(said["head_count"])
    w.add_head_count_kv(said["head_count_kv"])
    w.add_rope_freq_base(cfg.rope_theta)
    w.add_layer_norm_rms_eps(cfg.rms_eps)
    w.add_rope_dimension_count(said["rope_dimension_count"])
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types([3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS)))
    w.add_token_merges(MERGES)
    w.add_bos_token_id(cfg.bos)
    w.add_eos_token_id(cfg.eos)
    if template is not None:
        w.add_chat_template(template)
    tensor_fn = tensor_fn or (lambda name, arr: arr)
    w.add_tensor("token_embd.weight", tensor_fn("token_embd.weight", weights.tok_embd))
    w.add_tensor("output_norm.weight", weights.output_norm)
    names = {"attn_norm": "attn_norm", "wq": "attn_q", "wk": "attn_k", "wv": "attn_v", "wo": "attn_output",
             "ffn_norm": "ffn_norm", "w_gate": "ffn_gate", "w_up": "ffn_up", "w_down": "ffn_down"}
    for i, layer in enumerate(weights.layers):
        for field, g in names.items():
            arr = getattr(layer, field)
            if bad_type is not None and (i, field) == (1, "w_up"):
                block, size = gguf.GGML_QUANT_SIZES[bad_type]
                w.add_tensor(f"blk.{i}.{g}.weight", np.zeros((arr.shape[0], arr.shape[1] // block * size), np.uint8), raw_dtype=bad_type)
            else:
                w.add_tensor(f"blk.{i}.{g}.weight", tensor_fn(f"blk.{i}.{g}.weight", arr))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    # GGUF keeps float32 metadata
    return dataclasses.replace(cfg, rms_eps=float(np.float32(cfg.rms_eps)), rope_theta=float(np.float32(cfg.rope_theta))), weights
