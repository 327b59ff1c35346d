"""Host memory for model state: pages committed as written, and a pool of state blocks.

:func:`lazy_zeros` is how every host-side state buffer is allocated (the decoder's KV
cache, the block pool below). :class:`BlockPool` is the prefix cache's storage
(:mod:`sf_trt.prefix_cache`): a backend allocates it once
(:meth:`~sf_trt.primitives.PrimitivesBase.open_block_pool`), sized to the cache's
budget, and blocks are addressed by index. Saving a block copies into a slot taken
from the free list and evicting it gives the slot back, so a save allocates nothing
and the pool's memory is never more than the budget. Its pages are committed when a
slot is first written; a slot given back keeps them, and the free list hands out the
slot given back last first, so the resident size follows the most blocks ever held,
never the number of saves.
"""

from __future__ import annotations

import mmap
from typing import Iterable, Optional, Sequence

import numpy as np

__all__ = ["BlockPool", "lazy_zeros"]


def lazy_zeros(shape: tuple[int, ...], dtype) -> np.ndarray:
    """A zeroed array whose memory is committed in small (4 KiB) pages as they are first written.

    ``np.zeros`` asks the kernel for transparent huge pages on arrays of 4 MiB and more, so the
    first write anywhere in a 2 MiB stretch zeroes (and may first compact memory for) all of it.
    A KV cache is written a position at a time across every (layer, lane, head) row: with huge
    pages a lane's first prefill paid for its whole window, 1-3 s at the model's context of 8192
    on this CPU, and the RSS grew by the window instead of the positions written
    (docs/benchmarks.md, "Reproducing our own numbers"). Where the platform has no anonymous
    ``mmap`` this is ``np.zeros``."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape)) * dtype.itemsize
    if nbytes == 0 or not hasattr(mmap, "MAP_ANONYMOUS"):
        return np.zeros(shape, dtype)
    buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):  # also where the kernel's THP setting is "always"
        buf.madvise(mmap.MADV_NOHUGEPAGE)
    return np.frombuffer(buf, dtype).reshape(shape)


def _block_bytes(parts: Sequence[tuple[tuple[int, ...], np.dtype]]) -> int:
    return sum(int(np.prod(shape)) * np.dtype(dtype).itemsize for shape, dtype in parts)


class BlockPool:
    """``capacity`` blocks of ``block_tokens`` positions of a backend's state, allocated once.

    ``parts``: the ``(shape, dtype)`` of each array one block holds (the decoder: K and V,
    ``[n_layers, n_kv_heads, block_tokens, head_dim]`` each; the fake: its tokens,
    ``[block_tokens]``). ``arrays[i]`` is part ``i`` of every block, ``[capacity, *shape]``:
    block ``k``'s part ``i`` is ``arrays[i][k]``. The pool keeps only the books of which
    slots are taken; what a slot holds is the backend's to write and read."""

    def __init__(self, capacity: int, block_tokens: int, parts: Sequence[tuple[tuple[int, ...], np.dtype]]) -> None:
        if capacity < 0 or block_tokens < 1 or not parts:
            raise ValueError(f"BlockPool: need capacity >= 0, block_tokens >= 1 and a part (got {capacity}, {block_tokens}, {len(parts)} parts)")
        self.capacity = int(capacity)
        self.block_tokens = int(block_tokens)
        self.arrays = [lazy_zeros((self.capacity, *shape), dtype) for shape, dtype in parts]
        self.block_bytes = _block_bytes(parts)
        """Bytes one block holds (all its parts)."""
        self._free = list(range(self.capacity - 1, -1, -1))  # a stack: the slot given back last is taken first
        self._taken = np.zeros(self.capacity, bool)

    @classmethod
    def for_budget(cls, budget_bytes: int, block_tokens: int, parts: Sequence[tuple[tuple[int, ...], np.dtype]]) -> "BlockPool":
        """As many blocks as fit in ``budget_bytes``."""
        return cls(int(budget_bytes) // max(_block_bytes(parts), 1), block_tokens, parts)

    @property
    def used(self) -> int:
        """Slots taken."""
        return self.capacity - len(self._free)

    @property
    def nbytes(self) -> int:
        """The pool's size: what it may commit at most."""
        return self.capacity * self.block_bytes

    def take(self) -> Optional[int]:
        """A free slot's index, now taken; None when every slot is."""
        if not self._free:
            return None
        index = self._free.pop()
        self._taken[index] = True
        return index

    def give_back(self, index: int) -> None:
        """Slot ``index`` is free again (its bytes stay until the slot is next written)."""
        if not self.is_taken(index):
            raise ValueError(f"BlockPool.give_back({index}): not a taken slot (capacity {self.capacity}, {self.used} taken)")
        self._taken[index] = False
        self._free.append(int(index))

    def is_taken(self, index: int) -> bool:
        return 0 <= int(index) < self.capacity and bool(self._taken[int(index)])

    def check_integrity(self, held: Iterable[int]) -> None:
        """Raise AssertionError unless the slots taken are exactly ``held`` (each once) and the
        free list holds every other slot once."""
        held = list(held)
        if len(set(held)) != len(held) or sorted(held) != np.flatnonzero(self._taken).tolist():
            raise AssertionError(f"block pool: {len(held)} blocks held in slots {sorted(held)[:8]}..., taken {np.flatnonzero(self._taken).tolist()[:8]}...")
        if sorted(held + self._free) != list(range(self.capacity)):
            raise AssertionError(f"block pool: {len(held)} held and {len(self._free)} free do not partition its {self.capacity} slots")
