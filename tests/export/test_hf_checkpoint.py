"""Hugging Face checkpoint directories (sf_trt.export.hf_checkpoint), checked against transformers.

The fixtures under tests/fixtures/models/<variant>/ are tiny random-weight checkpoints that
tools/make_hf_fixtures.py wrote with transformers, beside transformers' fp32 logits (stored as
float16) and greedy tokens: CI needs no torch. Tolerance: each logit within float16's rounding of
the stored value, ``|sf_trt - transformers| <= 2**-10 * |transformers| + 1e-4``; greedy tokens identical.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from sf_trt.abi import Sampling, SamplingFlag, SamplingParams
from sf_trt.backends.ort_decoder import OrtDecoderPrimitives
from sf_trt.export.hf_checkpoint import HFError, load_hf, read_hf_config, read_hf_tokenizer
from sf_trt.export.pipeline import export_model_dir
from sf_trt.generate import Generator
from sf_trt.primitives import Rows
from sf_trt.scheduler import Request

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "models"
VARIANTS = sorted(p.name for p in FIXTURES.iterdir() if (p / "reference.json").is_file())
FAMILY = {"llama3": "llama"}


def test_every_family_has_a_fixture():
    assert {FAMILY.get(v, v) for v in VARIANTS} == {"llama", "mistral", "qwen2", "qwen3", "gemma3", "phi3"}
    assert "llama3" in VARIANTS


@pytest.fixture(scope="module", params=VARIANTS)
def exported(request, tmp_path_factory):
    """``(variant, model_dir, reference)``: the fixture exported with float32 weights."""
    src = FIXTURES / request.param
    out = export_model_dir(src, tmp_path_factory.mktemp(request.param) / "model", progress=False, weight_dtype="float32")
    ref = json.loads((src / "reference.json").read_text())
    return request.param, out, ref, np.load(src / "logits.npy").astype(np.float32)


def test_the_rows_are_transformers_fp32_logits(exported):
    variant, model_dir, ref, logits = exported
    with OrtDecoderPrimitives(model_dir, max_lanes=2, max_context=64, threads=1) as prims:
        for i, prompt in enumerate(ref["prompts"]):
            n = len(prompt)
            got = prims.forward(Rows(np.full(n, i, np.int64), np.arange(n, dtype=np.int64), np.asarray(prompt, np.int64), np.arange(n, dtype=np.int64)))
            np.testing.assert_allclose(np.asarray(got), logits[i, :n], rtol=2**-10, atol=1e-4, err_msg=f"{variant} prompt {i}")


def test_greedy_tokens_are_transformers(exported):
    variant, model_dir, ref, _ = exported
    params = SamplingParams(max_tokens=len(ref["greedy"][0]), flags=SamplingFlag.IGNORE_EOS)
    with OrtDecoderPrimitives(model_dir, max_lanes=2, max_context=64, threads=1) as prims:
        gen = Generator(prims)
        for speculate in (False, True):
            got = gen.run([Request(p, Sampling.GPU_GREEDY, params, speculate=speculate) for p in ref["prompts"]])
            assert [list(r.tokens) for r in got] == ref["greedy"], (variant, speculate)


def test_config_and_family_are_read(exported):
    variant, model_dir, _, _ = exported
    cfg, _ = read_hf_config(FIXTURES / variant)
    assert cfg.arch == FAMILY.get(variant, variant)
    meta = json.loads((model_dir / "config.json").read_text())
    assert meta["gguf"]["kind"] == "hf" and meta["llama"]["arch"] == cfg.arch
    if variant == "gemma3":
        assert (cfg.sliding_layers, cfg.sliding_window, cfg.rope_local_theta, cfg.query_scale) == ((0,), 8, 10000.0, 24**-0.5)
    if variant == "mistral":
        assert (cfg.sliding_layers, cfg.sliding_window) == ((0, 1), 8)


def test_llama3_rope_scaling_and_biases_are_used():
    cfg, weights = load_hf(FIXTURES / "llama3")
    assert weights.rope_factors is not None and weights.rope_factors.min() == 1.0 and weights.rope_factors.max() == 8.0
    assert 1.0 < np.sort(weights.rope_factors)[1] < 8.0  # a blended (medium) frequency
    assert all(layer.bq is not None and layer.b_down is not None for layer in weights.layers)
    assert cfg.tied_embeddings and weights.lm_head is None


@pytest.mark.parametrize("variant", ["llama", "gemma3"])
def test_the_tokenizer_and_its_chat_template(variant):
    cfg, _ = read_hf_config(FIXTURES / variant)
    tok = read_hf_tokenizer(FIXTURES / variant, cfg)
    assert tok.decode(tok.encode("the thethe é 日本")) == "the thethe é 日本"
    assert tok.encode("<|im_end|>") == [2]
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tools=[{"name": "search"}, {"name": "add"}])
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>tools\nsearch, add<|im_end|>\n<|im_start|>assistant\n"


def _copy(variant: str, tmp_path: Path) -> Path:
    out = tmp_path / variant
    shutil.copytree(FIXTURES / variant, out)
    return out


def _edit_config(d: Path, **changes) -> None:
    conf = json.loads((d / "config.json").read_text())
    conf.update(changes)
    (d / "config.json").write_text(json.dumps(conf))


def test_a_tensor_the_model_would_not_use_is_refused_naming_it(tmp_path):
    from safetensors.numpy import load_file, save_file

    d = _copy("qwen3", tmp_path)
    tensors = load_file(str(d / "model.safetensors"))
    tensors["model.layers.0.self_attn.rotary_emb.inv_freq"] = np.ones(16, np.float32)  # what older checkpoints carry
    save_file(tensors, str(d / "model.safetensors"))
    with pytest.raises(HFError, match=r"tensor 'model\.layers\.0\.self_attn\.rotary_emb\.inv_freq' is not used by sf_trt's qwen3 decoder; refusing to ignore it"):
        load_hf(d)


def test_a_missing_tensor_is_refused_naming_it(tmp_path):
    from safetensors.numpy import load_file, save_file

    d = _copy("qwen3", tmp_path)
    tensors = load_file(str(d / "model.safetensors"))
    del tensors["model.layers.1.self_attn.k_norm.weight"]
    save_file(tensors, str(d / "model.safetensors"))
    with pytest.raises(HFError, match=r"the checkpoint has no tensor 'model\.layers\.1\.self_attn\.k_norm\.weight' \(expected a qwen3 model\)"):
        load_hf(d)


@pytest.mark.parametrize("changes, words", [
    ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0}}, "rope scaling 'yarn' is not supported (supported: default, linear, llama3)"),
    ({"model_type": "gpt_neox"}, "model_type 'gpt_neox' is not supported (supported: llama, mistral, qwen2, qwen3, gemma3_text, phi3)"),
    ({"hidden_act": "relu"}, "activation 'relu' is not supported for llama (expected 'silu')"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}}, "partial rotary embeddings (partial_rotary_factor 0.5) are not supported"),
])
def test_settings_the_graph_would_not_compute_are_refused(tmp_path, changes, words):
    d = _copy("llama", tmp_path)
    _edit_config(d, **changes)
    with pytest.raises(HFError, match=re.escape(words)):
        load_hf(d)


def test_a_layer_count_the_checkpoint_lacks_is_refused_before_anything_is_listed(tmp_path):
    d = _copy("qwen2", tmp_path)
    _edit_config(d, num_hidden_layers=10**9, layer_types=None)
    with pytest.raises(HFError, match=r"config\.json's num_hidden_layers 1000000000, the checkpoint holds 2 layers"):
        load_hf(d)


def test_a_shape_that_disagrees_with_the_config_is_refused(tmp_path):
    d = _copy("mistral", tmp_path)
    _edit_config(d, intermediate_size=96)
    with pytest.raises(HFError, match=r"tensor 'model\.layers\.0\.mlp\.gate_proj\.weight' has shape \(128, 64\), config\.json implies \(96, 64\)"):
        load_hf(d)


def test_a_directory_without_safetensors_is_refused(tmp_path):
    d = tmp_path / "ckpt"
    d.mkdir()
    shutil.copy(FIXTURES / "llama" / "config.json", d)
    (d / "pytorch_model.bin").write_bytes(b"x")
    with pytest.raises(HFError, match=r"no model\.safetensors or model\.safetensors\.index\.json \(expected safetensors weights\) \(found pytorch_model\.bin: PyTorch pickles are not read\)"):
        load_hf(d)


def test_the_command_line_runs_a_checkpoint_directory(tmp_path):
    """``--hf DIR`` on export and generate: transformers' greedy tokens, as a user gets them."""
    from cli_run import sf_trt

    ref = json.loads((FIXTURES / "gemma3" / "reference.json").read_text())
    env = {"SF_TRT_CACHE": str(tmp_path / "cache")}
    sf_trt("export", "--hf", str(FIXTURES / "gemma3"), "--out", str(tmp_path / "m"), "--weights", "float32", check=True, env=env)
    ids = ",".join(map(str, ref["prompts"][0]))
    for model in (["--model", str(tmp_path / "m")], ["--hf", str(FIXTURES / "gemma3"), "--weights", "float32"]):
        out = sf_trt("generate", *model, "--prompt-ids", ids, "--max-tokens", "16", "--ignore-eos", "--json", check=True, env=env)
        assert json.loads(out.stdout)["tokens"] == ref["greedy"][0]
    proc = sf_trt("export", "--hf", str(tmp_path / "absent"), env=env)
    assert proc.returncode == 1
    assert proc.stderr.strip() == f"sf-trt: {tmp_path / 'absent'}: no such directory (expected a Hugging Face checkpoint directory)"


def test_inspect_says_what_a_source_holds_and_whether_it_is_supported(tmp_path):
    """``sf-trt inspect``: a supported checkpoint and GGUF, and an unsupported one with the export's own reason."""
    from cli_run import sf_trt
    from tiny_gguf import write_tiny_gguf

    out = sf_trt("inspect", str(FIXTURES / "gemma3"), check=True).stdout
    assert "architecture  gemma3_text" in out and "sliding window 8 on 1 of 2 layers" in out and "BF16 x28" in out
    assert out.rstrip().endswith("supported     yes")
    write_tiny_gguf(tmp_path / "q3.gguf", family_name="qwen3")
    facts = json.loads(sf_trt("inspect", "--json", str(tmp_path / "q3.gguf"), check=True).stdout)
    assert (facts["kind"], facts["architecture"], facts["supported"], facts["config"]["head_dim"]) == ("gguf", "qwen3", True, 32)
    write_tiny_gguf(tmp_path / "phi.gguf", family_name="phi3", extra={"blk.0.attn_q.bias": np.zeros(64, np.float32)})
    proc = sf_trt("inspect", str(tmp_path / "phi.gguf"))
    assert proc.returncode == 1
    assert proc.stdout.rstrip().endswith("supported     no: " + f"{tmp_path / 'phi.gguf'}: tensor 'blk.0.attn_q.bias' is not used by sf_trt's phi3 decoder; refusing to ignore it")
    d = _copy("llama", tmp_path)
    _edit_config(d, model_type="gpt_neox")
    facts = json.loads(sf_trt("inspect", "--json", str(d)).stdout)
    assert facts["supported"] is False and "model_type 'gpt_neox' is not supported" in facts["reason"]


def test_a_sentencepiece_tokenizer_json_is_read(tmp_path):
    """A checkpoint's tokenizer.json of sentencepiece's kind (Gemma's, Mistral's: ``▁`` pieces, a
    ByteFallback decoder) is read, its pieces decoded to the right bytes; a WordPiece one is refused."""
    from sf_trt.tokenizer import Tokenizer, TokenizerError

    pieces = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + ["\u2581", "t", "h", "e", "th", "he", "the", "\u2581the"]
    types = [3, 3, 3] + [6] * 256 + [1] * 8
    spm = Tokenizer.from_sentencepiece(pieces, [0.0] * 259 + [-1.0, -2.0, -3.0, -4.0, -5.0, -9.0, -6.0, -7.0], token_types=types,
                                       add_space_prefix=False, unk=0, bos=1, eos=2)
    d = _copy("llama", tmp_path)
    spm.save(d)  # tokenizer.json (and sf_trt's own tokenizer_config.json, which read_hf_tokenizer does not need)
    cfg, _ = read_hf_config(d)
    tok = read_hf_tokenizer(d, cfg)
    ids = tok.encode("the the é")
    assert tok.decode(ids) == "the the é" and ids[:2] == [pieces.index("the"), pieces.index("\u2581the")]
    spec = json.loads((d / "tokenizer.json").read_text())
    spec["decoder"] = {"type": "WordPiece", "prefix": "##", "cleanup": True}
    (d / "tokenizer.json").write_text(json.dumps(spec))
    with pytest.raises(TokenizerError, match=r"tokenizer\.json: a WordPiece decoder; sf_trt reads BPE tokenizers that are byte-level or sentencepiece's with byte fallback"):
        read_hf_tokenizer(d, cfg)
