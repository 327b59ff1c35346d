"""Exact prefix caching: the model state of earlier requests' prefixes, kept in blocks.

A new request whose prompt starts with a prefix an earlier (or running) request of
the same scope computed copies that prefix's state into its lane and prefills only
the rest. Because every row of a pass is bit-identical however the pass is packed
(docs/design.md), a cached block's bytes are what a fresh prefill would write, so a
cache hit changes when a request's first token comes, never which token it is.

Structure: a *hash chain* of blocks of :data:`BLOCK_TOKENS` positions. Block ``i``
of a prompt is keyed by ``(scope, parent block id, its tokens)``: the dict compares
keys exactly, so two different prefixes can never share a block (vLLM keys blocks
by a hash of the same triple and must trust the hash; a radix tree would give the
same lookups at the same cost with more code). A lookup walks the prompt's blocks
while they are found: ``prompt_len / BLOCK_TOKENS`` dict lookups.

Memory: a block's state lives in a slot of the backend's block pool
(:class:`~sf_trt.block_pool.BlockPool`, allocated once at the budget), which this index
hands out and takes back: a block kept takes a slot, an evicted one gives its slot
back, so the cache never holds more than the pool. A lane *pins* the chain it loaded or saved
until it is released, and a block with cached children is never evicted before
them, so eviction takes least recently used leaves only and never what a running
lane uses; when nothing can be evicted, a new block is simply not kept.

Scopes: a block is found only by lanes of the scope that saved it (the server's
tenant, as the suffix drafter's corpus), so one tenant's prompts never change
another's timing. ``None`` is private: nothing is looked up or kept.
"""

from __future__ import annotations

import dataclasses
import heapq
from typing import Callable, Optional, Sequence

from .block_pool import BlockPool

__all__ = ["BLOCK_TOKENS", "DEFAULT_PREFIX_CACHE_MB", "CachedBlock", "PrefixCache"]

BLOCK_TOKENS = 16
"""Positions per cached block (vLLM's default): a hit reuses whole blocks only."""

DEFAULT_PREFIX_CACHE_MB = 1024
"""The command line's and the server's budget (``--prefix-cache-mb``): for the default
model's fp32 KV (45 KiB a position), about 23k positions: five 4k conversations."""


@dataclasses.dataclass(eq=False)
class CachedBlock:
    """One block of a cached prefix: positions ``[start, start + BLOCK_TOKENS)``."""

    block_id: int
    key: tuple
    start: int
    index: int
    """Its slot in the block pool."""
    refs: int = 0
    """Lanes pinning it (their chains)."""
    children: int = 0
    """Cached blocks keyed under it."""
    last_used: int = 0


class PrefixCache:
    """Blocks of model state keyed by their token prefix, in ``pool``'s slots, least recently
    used evicted when the pool is full."""

    def __init__(self, pool: BlockPool, budget_bytes: Optional[int] = None) -> None:
        if budget_bytes is not None and pool.nbytes > budget_bytes:
            raise ValueError(f"PrefixCache: a pool of {pool.nbytes} bytes for a budget of {budget_bytes}")
        self.pool = pool
        self.block_tokens = pool.block_tokens
        self.budget_bytes = pool.nbytes if budget_bytes is None else int(budget_bytes)
        self.evictions = 0
        self._blocks: dict[tuple, CachedBlock] = {}
        self._by_id: dict[int, CachedBlock] = {}
        self._next_id = 1
        self._clock = 0
        self._lru: list[tuple[int, int]] = []  # (last_used, block id), lazily stale

    @property
    def bytes(self) -> int:
        """Bytes the cached blocks hold (their pool slots)."""
        return self.pool.used * self.pool.block_bytes

    def __len__(self) -> int:
        return len(self._blocks)

    # -- lookups -----------------------------------------------------------------------------

    def match(self, scope: Optional[str], tokens: Sequence[int], limit: int) -> list[CachedBlock]:
        """The longest chain of cached blocks that covers a prefix of ``tokens[:limit]``
        (whole blocks only; empty for the private scope None). Touches what it finds."""
        if scope is None:
            return []
        chain: list[CachedBlock] = []
        parent, b = 0, self.block_tokens
        for start in range(0, limit - b + 1, b):
            block = self._blocks.get((scope, parent, tuple(tokens[start : start + b])))
            if block is None:
                break
            chain.append(block)
            parent = block.block_id
        self._touch(chain)
        return chain

    def cached_len(self, scope: Optional[str], tokens: Sequence[int], limit: int) -> int:
        """Positions of ``tokens[:limit]`` the cache can supply (a multiple of the block size)."""
        return len(self.match(scope, tokens, limit)) * self.block_tokens

    # -- lanes' chains -------------------------------------------------------------------------

    def pin(self, chain: Sequence[CachedBlock]) -> None:
        """A lane holds ``chain``: none of it is evicted until :meth:`unpin`."""
        for block in chain:
            block.refs += 1

    def unpin(self, chain: Sequence[CachedBlock]) -> None:
        """The lane let ``chain`` go (released): its blocks are the most recently used."""
        self._touch(chain)
        for block in chain:
            block.refs -= 1
            self._maybe_evictable(block)

    def extend(
        self,
        scope: Optional[str],
        chain: list[CachedBlock],
        tokens: Sequence[int],
        length: int,
        save: Callable[[int, int], bool],
    ) -> list[CachedBlock]:
        """Grow the pinned ``chain`` (a lane's) over the whole blocks of ``tokens[:length]``:
        blocks already cached are adopted, the others saved from the lane into a pool slot
        with ``save(start, index)`` (False: the save failed, stop) while a slot can be had.
        Returns the chain, every block of it pinned."""
        if scope is None:
            return chain
        b = self.block_tokens
        for start in range(len(chain) * b, length - b + 1, b):
            parent = chain[-1] if chain else None
            key = (scope, parent.block_id if parent else 0, tuple(tokens[start : start + b]))
            block = self._blocks.get(key)
            if block is None:
                index = self._take_slot()
                if index is None:
                    break
                if not save(start, index):
                    self.pool.give_back(index)
                    break
                block = self._insert(key, start, index, parent)
            block.refs += 1
            chain.append(block)
        self._touch(chain)
        return chain

    # -- memory ------------------------------------------------------------------------------

    def _insert(self, key: tuple, start: int, index: int, parent: Optional[CachedBlock]) -> CachedBlock:
        block = CachedBlock(self._next_id, key, start, index)
        self._next_id += 1
        self._blocks[key] = self._by_id[block.block_id] = block
        if parent is not None:
            parent.children += 1
        return block

    def _take_slot(self) -> Optional[int]:
        """A pool slot, evicting least recently used unpinned leaves until one is free; None if none can be."""
        index = self.pool.take()
        while index is None and self._evict_one():
            index = self.pool.take()
        return index

    def _evict_one(self) -> bool:
        while self._lru:
            used, block_id = heapq.heappop(self._lru)
            block = self._by_id.get(block_id)
            if block is None or block.last_used != used or block.refs or block.children:
                continue  # stale: gone, touched since, pinned, or a parent
            del self._blocks[block.key], self._by_id[block_id]
            self.pool.give_back(block.index)
            self.evictions += 1
            parent = self._by_id.get(block.key[1])
            if parent is not None:
                parent.children -= 1
                self._maybe_evictable(parent)
            return True
        return False

    def _touch(self, chain: Sequence[CachedBlock]) -> None:
        if not chain:
            return
        self._clock += 1
        for block in chain:
            block.last_used = self._clock
            self._maybe_evictable(block)
        if len(self._lru) > 4 * len(self._blocks) + 64:  # drop stale entries now and then
            self._lru = [(b.last_used, b.block_id) for b in self._by_id.values() if not b.refs and not b.children]
            heapq.heapify(self._lru)

    def _maybe_evictable(self, block: CachedBlock) -> None:
        if not block.refs and not block.children:
            heapq.heappush(self._lru, (block.last_used, block.block_id))

    # -- for tests ---------------------------------------------------------------------------

    def check_integrity(self) -> None:
        """Raise AssertionError if the books disagree: pool slots, budget, children, refs, keys."""
        if self.pool.used != len(self._blocks) or self.pool.nbytes > self.budget_bytes:
            raise AssertionError(f"prefix cache: {len(self._blocks)} blocks, {self.pool.used} pool slots taken, a pool of {self.pool.nbytes} bytes for a {self.budget_bytes} budget")
        self.pool.check_integrity(b.index for b in self._blocks.values())
        children: dict[int, int] = {}
        for key, block in self._blocks.items():
            if self._by_id.get(block.block_id) is not block or block.key != key or block.refs < 0:
                raise AssertionError(f"prefix cache: block {block.block_id} is misfiled (refs {block.refs})")
            if key[1]:
                if key[1] not in self._by_id:
                    raise AssertionError(f"prefix cache: block {block.block_id}'s parent {key[1]} is gone")
                children[key[1]] = children.get(key[1], 0) + 1
        for block in self._blocks.values():
            if block.children != children.get(block.block_id, 0):
                raise AssertionError(f"prefix cache: block {block.block_id} counts {block.children} children, has {children.get(block.block_id, 0)}")

    def pins(self) -> int:
        """Pins held on blocks, over all lanes (a block two lanes pin counts twice)."""
        return sum(b.refs for b in self._blocks.values())
