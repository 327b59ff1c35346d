"""A tiny decoder of any family written as a real GGUF file (with a byte-level vocabulary and a chat template), for tests."""

from __future__ import annotations

import dataclasses

import numpy as np
from sf_trt.export.families import GGUF_LAYER_NAMES, family
from sf_trt.export.gguf_llama import ROTARY_FIELDS, unpermute_rotary_rows
from sf_trt.export.tiny import random_llama_weights, tiny_family_config

from sf_trt.formats.model_dir import LlamaConfig


def _byte_pieces() -> list[str]:
    from sf_trt.tokenizer.byte_level import byte_alphabet

    table = byte_alphabet()
    return [table[b] for b in range(256)]


SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


MERGES = ["Ġ t", "h e", "Ġt he"]


TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"


def _file_tensors(cfg: LlamaConfig, layer, order: str) -> dict[str, np.ndarray]:
    """A layer's tensors as a GGUF of its family stores them: fused where the family fuses,
    the rotary rows in transformers' order where llama.cpp's converter leaves them so."""
    held = {f: getattr(layer, f) for f in layer.present()}
    if order == "half":
        for name, heads in ROTARY_FIELDS.items():
            if name in held:
                held[name] = np.ascontiguousarray(unpermute_rotary_rows(held[name], 1 if heads is None else getattr(cfg, heads)))
    fam = family(cfg.arch)
    if "w_qkv" in fam.fused:
        held["w_qkv"] = np.concatenate([held.pop("wq"), held.pop("wk"), held.pop("wv")])
    if "w_gate_up" in fam.fused:
        held["w_gate_up"] = np.concatenate([held.pop("w_gate"), held.pop("w_up")])
    return held


def write_tiny_gguf(
    path, *, arch=None, seed=0, bad_type=None, context_length=512, template=TEMPLATE, meta=None, tensor_fn=None,
    family_name="llama", biases=False, rope_factors=False, extra=None, skip=(), shape=None, types=None,
) -> tuple[LlamaConfig, object]:
    """The tiny random model of ``family_name`` as a GGUF at ``path``; ``(cfg, weights)``.

    ``arch`` overrides ``general.architecture`` as written; ``meta`` overrides metadata as
    written (``{"block_count": 10**9}``: the GGUF then says what its tensors are not);
    ``tensor_fn(name, array)`` may change a tensor before it is written; ``extra`` adds tensors
    (``{name: array}``) and ``skip`` leaves tensors out, by name; ``shape`` overrides the tiny
    config's sizes (``{"ffn": 100}``), written truthfully; ``types`` stores layer tensors in GGML
    block types gguf can quantize, by name within ``blk.<i>.`` (``{"attn_q.weight": "Q4_0"}``; the
    weights returned are then the values before quantization)."""
    import gguf

    tokens = SPECIALS + _byte_pieces() + ["Ġt", "he", "Ġthe"]
    overrides = {"query_scale": 0.0} if family_name == "gemma3" else {}  # a GGUF says none: 1 / sqrt(head_dim)
    overrides.update(shape or {})
    cfg = tiny_family_config(family_name, vocab=len(tokens), bos=1, eos=2, context_length=context_length, **overrides)
    weights = random_llama_weights(cfg, seed, biases=biases, rope_factors=rope_factors)
    said = {"context_length": cfg.context_length, "embedding_length": cfg.hidden, "block_count": cfg.n_layers,
            "feed_forward_length": cfg.ffn, "head_count": cfg.n_heads, "head_count_kv": cfg.n_kv_heads,
            "rope_dimension_count": cfg.head_dim, **(meta or {})}
    name = arch or family_name
    w = gguf.GGUFWriter(str(path), name)
    w.add_context_length(said["context_length"])
    w.add_embedding_length(said["embedding_length"])
    w.add_block_count(said["block_count"])
    w.add_feed_forward_length(said["feed_forward_length"])
    w.add_head_count(said["head_count"])
    w.add_head_count_kv(said["head_count_kv"])
    if cfg.head_dim * cfg.n_heads != cfg.hidden:  # else the reader derives it
        w.add_key_length(cfg.head_dim)
        w.add_value_length(cfg.head_dim)
    w.add_rope_freq_base(cfg.rope_theta)
    w.add_layer_norm_rms_eps(cfg.rms_eps)
    w.add_rope_dimension_count(said["rope_dimension_count"])
    if cfg.sliding_window:
        w.add_sliding_window(cfg.sliding_window)
        if family_name == "gemma3":  # the tiny model's 2 layers: one sliding, one global
            w.add_uint32(f"{name}.attention.sliding_window_pattern", 2)
            w.add_float32(f"{name}.rope.freq_base_swa", cfg.rope_local_theta)
    if "rope_scaling_type" in (meta or {}):
        w.add_string(f"{name}.rope.scaling.type", meta["rope_scaling_type"])
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

    def add(name: str, arr: np.ndarray) -> None:
        if name not in skip:
            w.add_tensor(name, tensor_fn(name, arr))

    add("token_embd.weight", weights.tok_embd)
    add("output_norm.weight", weights.output_norm)
    if weights.lm_head is not None:
        add("output.weight", weights.lm_head)
    if weights.rope_factors is not None:
        add("rope_freqs.weight", weights.rope_factors)
    for i, layer in enumerate(weights.layers):
        for field, arr in _file_tensors(cfg, layer, family(cfg.arch).gguf_rope).items():
            tensor = f"blk.{i}.{GGUF_LAYER_NAMES[field]}"
            if bad_type is not None and (i, field) == (1, "w_up"):
                block, size = gguf.GGML_QUANT_SIZES[bad_type]
                w.add_tensor(tensor, np.zeros((arr.shape[0], arr.shape[1] // block * size), np.uint8), raw_dtype=bad_type)
            elif (types or {}).get(GGUF_LAYER_NAMES[field]):
                kind = gguf.GGMLQuantizationType[types[GGUF_LAYER_NAMES[field]]]
                w.add_tensor(tensor, gguf.quants.quantize(np.ascontiguousarray(arr, np.float32), kind), raw_dtype=kind)
            else:
                add(tensor, arr)
    for tensor, arr in (extra or {}).items():
        w.add_tensor(tensor, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    # GGUF keeps float32 metadata
    f32 = {k: float(np.float32(getattr(cfg, k))) for k in ("rms_eps", "rope_theta", "rope_local_theta")}
    return dataclasses.replace(cfg, **f32), weights
