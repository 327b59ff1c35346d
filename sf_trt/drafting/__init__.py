"""Drafters: model-free proposers of the tokens a lane's next pass verifies.

- :class:`Drafter` — the protocol the executor drives (:mod:`.base`).
- :class:`PromptLookupDrafter` — the latest earlier match of the lane's own
  suffix, by n-gram (:mod:`.prompt_lookup`).
- :class:`SuffixDrafter` — the most frequent continuation of the longest match in
  the lane's own text or in earlier requests' (:mod:`.suffix`), over suffix
  automata (:mod:`.automaton`) and a bounded, scoped :class:`SuffixCorpus`.

Kinds are registered in :mod:`sf_trt.strategies`; every kind is verified by the
executor and certified exact the same way.
"""

from .base import Drafter, DraftCap
from .prompt_lookup import PromptLookupConfig, PromptLookupDrafter
from .suffix import DEFAULT_SCOPE, SuffixConfig, SuffixCorpus, SuffixDrafter

__all__ = [
    "Drafter", "DraftCap", "PromptLookupConfig", "PromptLookupDrafter",
    "DEFAULT_SCOPE", "SuffixConfig", "SuffixCorpus", "SuffixDrafter",
]
