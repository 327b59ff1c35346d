"""The tokenizers: the model's BPE, byte-level or sentencepiece's (:class:`Tokenizer`, with the
``tokenizers`` library) and the fake backend's bytes (:class:`ByteTokenizer`).

By concern: :mod:`.base` (the error, the incremental :class:`StreamDecoder`, the
messages' check), :mod:`.byte_level` (a GGUF's byte-level BPE vocabulary built into
a ``tokenizers`` tokenizer), :mod:`.sentencepiece` (a GGUF's sentencepiece vocabulary, likewise), :mod:`.chat_template` (the sandbox chat templates
render in), :mod:`.bpe` (:class:`Tokenizer`: load, save, encode, decode, chat) and
:mod:`.byte` (:class:`ByteTokenizer`).
"""

from .base import StreamDecoder, TokenizerError
from .bpe import Tokenizer
from .byte import ByteTokenizer
from .chat_template import TEMPLATE_DEADLINE_S, TEMPLATE_MAX_CHARS

__all__ = ["Tokenizer", "ByteTokenizer", "StreamDecoder", "TokenizerError", "TEMPLATE_DEADLINE_S", "TEMPLATE_MAX_CHARS"]
