"""Model families as small declared differences over the one decoder (:mod:`.decoder_graph`).

A :class:`Family` is data: which per-layer tensors a family's files hold (and which they may
hold), its activation, whether its embeddings are scaled, how a configured sliding window falls
on its layers, where its files put the rotary pairs, and the names its GGUF and Hugging Face
files give each tensor. The loaders (:mod:`.gguf_llama`, :mod:`.hf_checkpoint`) read a file
through its family's names and refuse any tensor the family does not use; the graph builder and
the numpy reference read the same declaration. A new family is a new entry in
:data:`FAMILIES`, not a new builder.

Per-layer fields (:class:`~.gguf_llama.LlamaLayerWeights`)::

    attn_norm, wq, wk, wv, wo, ffn_norm, w_gate, w_up, w_down     every family
    bq, bk, bv, bo, b_gate, b_up, b_down                          biases (qwen2: bq/bk/bv always)
    q_norm, k_norm                                                per-head RMSNorm of q and k before
                                                                  the rotation (qwen3, gemma3)
    post_attn_norm, post_ffn_norm                                 RMSNorm of the attention's and the
                                                                  MLP's output before each residual
                                                                  add (gemma3)

``w_qkv`` / ``w_gate_up`` (phi3's fused matrices) are read from the file and split into
``wq, wk, wv`` / ``w_gate, w_up`` as they are loaded.
"""

from __future__ import annotations

import dataclasses

__all__ = [
    "Family", "FAMILIES", "family", "BASE_FIELDS", "BIAS_FIELDS", "NORM_FIELDS", "MATRIX_FIELDS", "GGUF_LAYER_NAMES",
    "HF_LAYER_NAMES", "ACTIVATIONS",
]

BASE_FIELDS = ("attn_norm", "wq", "wk", "wv", "wo", "ffn_norm", "w_gate", "w_up", "w_down")
BIAS_FIELDS = ("bq", "bk", "bv", "bo", "b_gate", "b_up", "b_down")
NORM_FIELDS = ("attn_norm", "ffn_norm", "q_norm", "k_norm", "post_attn_norm", "post_ffn_norm")
MATRIX_FIELDS = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")
BIAS_OF = {"bq": "wq", "bk": "wk", "bv": "wv", "bo": "wo", "b_gate": "w_gate", "b_up": "w_up", "b_down": "w_down"}
"""Each bias field and the matrix it is added to."""
ACTIVATIONS = ("silu", "gelu_tanh")
"""The gated MLP's activation of the gate: ``x * sigmoid(x)``, or GELU's tanh approximation."""

GGUF_LAYER_NAMES = {
    "attn_norm": "attn_norm.weight", "wq": "attn_q.weight", "wk": "attn_k.weight", "wv": "attn_v.weight",
    "wo": "attn_output.weight", "ffn_norm": "ffn_norm.weight", "w_gate": "ffn_gate.weight", "w_up": "ffn_up.weight",
    "w_down": "ffn_down.weight", "bq": "attn_q.bias", "bk": "attn_k.bias", "bv": "attn_v.bias", "bo": "attn_output.bias",
    "b_gate": "ffn_gate.bias", "b_up": "ffn_up.bias", "b_down": "ffn_down.bias", "q_norm": "attn_q_norm.weight",
    "k_norm": "attn_k_norm.weight", "post_attn_norm": "post_attention_norm.weight", "post_ffn_norm": "post_ffw_norm.weight",
    "w_qkv": "attn_qkv.weight", "w_gate_up": "ffn_up.weight",
}
"""llama.cpp's name of each field within ``blk.<i>.``."""

HF_LAYER_NAMES = {
    "attn_norm": "input_layernorm.weight", "wq": "self_attn.q_proj.weight", "wk": "self_attn.k_proj.weight",
    "wv": "self_attn.v_proj.weight", "wo": "self_attn.o_proj.weight", "ffn_norm": "post_attention_layernorm.weight",
    "w_gate": "mlp.gate_proj.weight", "w_up": "mlp.up_proj.weight", "w_down": "mlp.down_proj.weight",
    "bq": "self_attn.q_proj.bias", "bk": "self_attn.k_proj.bias", "bv": "self_attn.v_proj.bias", "bo": "self_attn.o_proj.bias",
    "b_gate": "mlp.gate_proj.bias", "b_up": "mlp.up_proj.bias", "b_down": "mlp.down_proj.bias",
    "q_norm": "self_attn.q_norm.weight", "k_norm": "self_attn.k_norm.weight", "w_qkv": "self_attn.qkv_proj.weight",
    "w_gate_up": "mlp.gate_up_proj.weight",
}
"""transformers' name of each field within ``model.layers.<i>.`` (a family may override some)."""


@dataclasses.dataclass(frozen=True)
class Family:
    """What sets a decoder family apart from Llama's (module docstring)."""

    name: str
    required: tuple[str, ...] = BASE_FIELDS
    """Per-layer fields every file of the family holds (a file without one is refused)."""
    optional: tuple[str, ...] = ()
    """Per-layer fields used when a file holds them (never ignored when it does)."""
    fused: tuple[str, ...] = ()
    """Fused matrices the files hold instead of their parts: ``"w_qkv"``, ``"w_gate_up"``."""
    activation: str = "silu"
    embed_scale: bool = False
    """Embedding rows multiplied by ``sqrt(hidden)`` (Gemma)."""
    hf_norm_offset: float = 0.0
    """transformers stores ``w`` where the norm multiplies by ``offset + w`` (Gemma: 1; llama.cpp's
    converter adds it, so a GGUF holds ``1 + w``)."""
    gguf_rope: str = "half"
    """The order of the q/k rows in the family's GGUF: ``"interleaved"`` where llama.cpp's converter
    permuted them (llama), ``"half"`` where it left transformers' order (NEOX-style rotation)."""
    sliding: str = "none"
    """How a configured sliding window falls on the layers: ``"none"`` (a window is refused),
    ``"all"`` (every layer), ``"pattern"`` (every ``sliding_pattern``-th layer is global)."""
    sliding_pattern: int = 0
    rope_factors: bool = False
    """Llama 3's per-frequency rope divisors (``rope_freqs.weight``, ``rope_scaling: llama3``)."""
    default_local_theta: float = 0.0
    """The rope base of sliding layers when the file names none (0: the model's ``rope_theta``)."""
    hf_model_types: tuple[str, ...] = ()
    hf_names: tuple[tuple[str, str], ...] = ()
    """Overrides of :data:`HF_LAYER_NAMES` (field, name)."""

    @property
    def layer_fields(self) -> tuple[str, ...]:
        """Every per-layer field a graph of this family may carry (after fused matrices are split)."""
        return tuple(dict.fromkeys(self.required + self.optional))

    def file_fields(self) -> tuple[tuple[str, bool], ...]:
        """``(field, required)`` for each per-layer tensor a file of the family holds: the fused
        matrices in place of their parts."""
        parts = {"w_qkv": ("wq", "wk", "wv"), "w_gate_up": ("w_gate", "w_up")}
        replaced = {p for f in self.fused for p in parts[f]}
        out = [(f, True) for f in self.required if f not in replaced] + [(f, True) for f in self.fused]
        return tuple(out + [(f, False) for f in self.optional if f not in self.required])

    def source_of(self, field: str) -> str:
        """The field of the file's tensor that ``field`` is read from: a fused matrix for its parts."""
        fused = {"wq": "w_qkv", "wk": "w_qkv", "wv": "w_qkv", "w_gate": "w_gate_up", "w_up": "w_gate_up"}.get(field)
        return fused if fused in self.fused else field

    def hf_name(self, field: str) -> str:
        return dict(self.hf_names).get(field) or HF_LAYER_NAMES[field]

    def sliding_layers(self, n_layers: int, window: int) -> tuple[int, ...]:
        """The layers a configured ``window`` (0: none) applies to."""
        if not window or self.sliding == "none":
            return ()
        if self.sliding == "all":
            return tuple(range(n_layers))
        return tuple(i for i in range(n_layers) if (i + 1) % self.sliding_pattern)


_LLAMA_EXTRAS = BIAS_FIELDS

FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family("llama", optional=_LLAMA_EXTRAS, gguf_rope="interleaved", rope_factors=True, sliding="all", hf_model_types=("llama",)),
        Family("mistral", optional=_LLAMA_EXTRAS, gguf_rope="interleaved", sliding="all", hf_model_types=("mistral",)),
        Family("qwen2", required=BASE_FIELDS + ("bq", "bk", "bv"), optional=BIAS_FIELDS, hf_model_types=("qwen2",)),
        Family("qwen3", required=BASE_FIELDS + ("q_norm", "k_norm"), optional=BIAS_FIELDS, hf_model_types=("qwen3",)),
        Family(
            "gemma3", required=BASE_FIELDS + ("q_norm", "k_norm", "post_attn_norm", "post_ffn_norm"), activation="gelu_tanh",
            embed_scale=True, hf_norm_offset=1.0, sliding="pattern", sliding_pattern=6, default_local_theta=10000.0,
            hf_model_types=("gemma3_text",),
            hf_names=(("ffn_norm", "pre_feedforward_layernorm.weight"), ("post_attn_norm", "post_attention_layernorm.weight"),
                      ("post_ffn_norm", "post_feedforward_layernorm.weight")),
        ),
        Family("phi3", fused=("w_qkv", "w_gate_up"), sliding="all", hf_model_types=("phi3",)),
    )
}
"""The supported families, by their GGUF ``general.architecture``."""


def family(name: str) -> Family:
    """The family ``name``; ``ValueError`` listing the supported ones."""
    found = FAMILIES.get(name)
    if found is None:
        raise ValueError(f"architecture {name!r} is not supported (supported: {', '.join(FAMILIES)})")
    return found
