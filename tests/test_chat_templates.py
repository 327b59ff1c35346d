"""Each family's kind of chat template renders in the sandbox as transformers renders it:
``raise_exception``, ``strftime_now``, loop controls (``break``, ``continue``), ``tools=`` and a
``tojson`` that leaves text unescaped. The templates are written here in each family's style
(the features its published template uses), not copied from one."""

from __future__ import annotations

import datetime
import json

import pytest
from tiny_gguf import MERGES, SPECIALS, _byte_pieces

from sf_trt.tokenizer import Tokenizer, TokenizerError

LLAMA3 = """{{ bos_token }}{% set date = strftime_now("%d %b %Y") %}
{% if messages[0]['role'] == 'system' %}{% set system = messages[0]['content'] %}{% set rest = messages[1:] %}{% else %}{% set system = '' %}{% set rest = messages %}{% endif %}
<|im_start|>system
Today Date: {{ date }}
{% if tools is not none %}You may call: {% for t in tools %}{{ t | tojson }}{% if not loop.last %} {% endif %}{% endfor %}
{% endif %}{{ system }}<|im_end|>
{% for m in rest %}{% if m['role'] == 'system' %}{{ raise_exception('a system message must come first') }}{% endif %}<|im_start|>{{ m['role'] }}
{{ m['content'] | trim }}<|im_end|>
{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

QWEN = """{% set ns = namespace(last_user=-1) %}{% for m in messages %}{% if m['role'] == 'user' %}{% set ns.last_user = loop.index0 %}{% endif %}{% endfor %}
{% if tools %}<|im_start|>system
<tools>{% for t in tools %}
{{ t | tojson }}{% endfor %}
</tools><|im_end|>
{% endif %}{% for m in messages %}{% if m['role'] == 'tool' %}{% continue %}{% endif %}<|im_start|>{{ m['role'] }}
{{ m['content'] }}{% if loop.index0 == ns.last_user %} (last){% endif %}<|im_end|>
{% if loop.index0 >= 8 %}{% break %}{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

GEMMA3 = """{{ bos_token }}{% for m in messages %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}{% endif %}<|im_start|>{{ 'model' if m['role'] == 'assistant' else m['role'] }}
{{ m['content'] | trim }}<|im_end|>
{% endfor %}{% if add_generation_prompt %}<|im_start|>model
{% endif %}"""

PHI3 = """{% for m in messages %}{% if m['role'] == 'system' %}<|im_start|>system
{{ m['content'] }}<|im_end|>
{% elif m['role'] == 'user' %}<|im_start|>user
{{ m['content'] }}<|im_end|>
{% elif m['role'] == 'assistant' %}<|im_start|>assistant
{{ m['content'] }}<|im_end|>
{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant
{% else %}{{ eos_token }}{% endif %}"""

TOOLS = [{"name": "weather", "description": "Météo <à Paris>", "parameters": {"city": "string"}}]


def tokenizer(template: str) -> Tokenizer:
    tokens = SPECIALS + _byte_pieces() + ["Ġt", "he", "Ġthe"]
    return Tokenizer.from_vocab(tokens, MERGES, token_types=[3] * 3 + [1] * (len(tokens) - 3), pre="smollm", bos=1, eos=2, chat_template=template)


def test_llama3_style_strftime_now_tools_and_tojson():
    tok = tokenizer(LLAMA3)
    text = tok.apply_chat_template([{"role": "system", "content": "Be brief."}, {"role": "user", "content": " hi "}], tools=TOOLS)
    today = datetime.datetime.now().strftime("%d %b %Y")
    assert text == (
        f"<|im_start|><|im_start|>system\nToday Date: {today}\nYou may call: {json.dumps(TOOLS[0], ensure_ascii=False)}Be brief.<|im_end|>\n"
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )
    assert "Météo <à Paris>" in text  # transformers' tojson: no HTML escaping, no ASCII escaping
    assert "<|im_start|>user\nhi" in tok.decode(tok.encode_chat([{"role": "user", "content": "hi"}], tools=None))
    with pytest.raises(TokenizerError, match=r"^chat template: a system message must come first$"):
        tok.apply_chat_template([{"role": "user", "content": "a"}, {"role": "system", "content": "b"}])


def test_qwen_style_loop_controls_and_namespace():
    tok = tokenizer(QWEN)
    messages = [{"role": "user", "content": "one"}, {"role": "tool", "content": "skipped"}, {"role": "assistant", "content": "two"},
                {"role": "user", "content": "three"}]
    text = tok.apply_chat_template(messages, tools=TOOLS)
    assert text.startswith("<|im_start|>system\n<tools>" + json.dumps(TOOLS[0], ensure_ascii=False) + "</tools><|im_end|>\n")  # trim_blocks
    assert "skipped" not in text and "three (last)" in text and "one (last)" not in text
    many = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"m{i}"} for i in range(12)]
    rendered = tok.apply_chat_template(many)
    assert "m8" in rendered and "m9" not in rendered  # {% break %} after the ninth


def test_gemma3_style_raise_exception_on_roles_that_do_not_alternate():
    tok = tokenizer(GEMMA3)
    ok = tok.apply_chat_template([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}])
    assert ok.endswith("<|im_start|>user\nc<|im_end|>\n<|im_start|>model\n") and "<|im_start|>model\nb" in ok
    with pytest.raises(TokenizerError, match=r"^chat template: Conversation roles must alternate user/assistant/user/assistant/\.\.\.$"):
        tok.apply_chat_template([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])


def test_phi3_style_eos_when_no_generation_prompt():
    tok = tokenizer(PHI3)
    assert tok.apply_chat_template([{"role": "user", "content": "a"}], add_generation_prompt=False).endswith("<|im_end|>\n<|im_end|>")
