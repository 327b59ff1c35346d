"""A random-weight GGUF of a real model's shape, written tensor by tensor, for measuring an export.

    python tools/synthetic_gguf.py OUT.gguf [--shape tinyllama-1.1b] [--type Q8_0] [--context 8192]
    /usr/bin/time -v sf-trt export --gguf OUT.gguf --out DIR --weights float32   # "Maximum resident set size"

The shapes are the models' own (``SHAPES``); weights are N(0, 1/in), quantized per tensor to
``--type`` (any type gguf can quantize: Q8_0, F16, ...), and streamed to the file one tensor at a
time (``GGUFWriter.add_tensor_info`` then ``write_tensor_data``), so writing an 8B GGUF needs one
tensor's memory, not the model's. The vocabulary is byte-level pieces padded with ``<unused{i}>``,
so the export's tokenizer builds, and a chat template of TinyLlama's form (``<|user|>`` ...
``</s>``, ``<|assistant|>``) lets chat prompts (``sf-trt bench``, tools/bench_peers.py) run on it.
Random weights write nonsense text: drive such a model with token ids where the text matters
(``tools/bench_prefix_cache.py --token-prompts``). ``--context`` sets the context length
the file declares (rope has no trained length here: a 4k benchmark of the 1.1B shape needs more
than its own 2048); ``--shape smoke`` is a few-MB model of the same layout, for trying a command.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
"""TinyLlama-chat's turn markers (a role line, the text, ``</s>``), so chat prompts tokenize."""

SHAPES = {
    "smoke": dict(n_layers=2, hidden=128, n_heads=4, n_kv_heads=2, ffn=256, vocab=512, context=2048),
    "tinyllama-1.1b": dict(n_layers=22, hidden=2048, n_heads=32, n_kv_heads=4, ffn=5632, vocab=32000, context=2048),
    "llama-3.1-8b": dict(n_layers=32, hidden=4096, n_heads=32, n_kv_heads=8, ffn=14336, vocab=128256, context=8192),
}


def main() -> None:
    import gguf

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--shape", choices=SHAPES, default="tinyllama-1.1b")
    p.add_argument("--type", default="Q8_0")
    p.add_argument("--context", type=int, default=None, help="the context length the file declares (default: the shape's)")
    args = p.parse_args()
    s = {**SHAPES[args.shape], **({"context": args.context} if args.context else {})}
    qtype = gguf.GGMLQuantizationType[args.type]
    h, hd = s["hidden"], s["hidden"] // s["n_heads"]
    rng = np.random.default_rng(0)
    alphabet = [chr(c) for c in range(33, 127)]
    pieces = ["<unk>", "<s>", "</s>"] + alphabet + ["ab"] + [f"<unused{i}>" for i in range(s["vocab"] - 4 - len(alphabet))]
    w = gguf.GGUFWriter(str(args.out), "llama")
    w.add_context_length(s["context"])
    w.add_embedding_length(h)
    w.add_block_count(s["n_layers"])
    w.add_feed_forward_length(s["ffn"])
    w.add_head_count(s["n_heads"])
    w.add_head_count_kv(s["n_kv_heads"])
    w.add_rope_dimension_count(hd)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(pieces)
    w.add_token_types([3, 3, 3] + [1] * (len(pieces) - 3))
    w.add_token_merges(["a b"])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_chat_template(CHAT_TEMPLATE)
    tensors = [("token_embd.weight", (s["vocab"], h)), ("output_norm.weight", (h,)), ("output.weight", (s["vocab"], h))]
    q, kv = s["n_heads"] * hd, s["n_kv_heads"] * hd
    for i in range(s["n_layers"]):
        tensors += [
            (f"blk.{i}.attn_norm.weight", (h,)), (f"blk.{i}.attn_q.weight", (q, h)), (f"blk.{i}.attn_k.weight", (kv, h)),
            (f"blk.{i}.attn_v.weight", (kv, h)), (f"blk.{i}.attn_output.weight", (h, q)), (f"blk.{i}.ffn_norm.weight", (h,)),
            (f"blk.{i}.ffn_gate.weight", (s["ffn"], h)), (f"blk.{i}.ffn_up.weight", (s["ffn"], h)), (f"blk.{i}.ffn_down.weight", (h, s["ffn"])),
        ]

    def value(shape: tuple[int, ...]) -> np.ndarray:
        if len(shape) == 1:
            return np.ones(shape, np.float32)
        return gguf.quants.quantize((rng.standard_normal(shape, np.float32) / np.sqrt(shape[1])).astype(np.float32), qtype)

    for name, shape in tensors:  # the table first (a quantized tensor's shape in bytes per row, as gguf takes it)
        if len(shape) == 1:
            w.add_tensor_info(name, shape, np.dtype(np.float32), 4 * shape[0])
            continue
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        byte_shape = (*shape[:-1], shape[-1] // block * size)
        w.add_tensor_info(name, byte_shape, np.dtype(np.uint8), int(np.prod(byte_shape)), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, shape in tensors:
        w.write_tensor_data(value(shape))
    w.close()
    print(f"{args.out}: {args.shape}, {args.type}, {args.out.stat().st_size / 1e9:.2f} GB")


if __name__ == "__main__":
    main()
