"""Prefix blocks' identity: the chained hash of each BLOCK_TOKENS-token block of a token
sequence, the same in every process and run. The router (cluster/router.py) keys the
prefixes it sent each replica by them, and the KV-event stream (frontend/kv_events.py)
names the prefix cache's blocks with them. Pure CPU.
"""

from __future__ import annotations

import hashlib

BLOCK_TOKENS = 16  # tokens a prefix block; the KV-event stream uses the same size


def block_hashes(token_ids: list[int], block_tokens: int = BLOCK_TOKENS,
                 parent: int | None = None) -> list[int]:
    """The chained hash of each full block of `token_ids`: block i's hash covers blocks
    0..i (63 bits: a non-negative int64; stable across processes and runs)."""
    out = []
    prev = parent or 0
    for start in range(0, len(token_ids) - block_tokens + 1, block_tokens):
        h = hashlib.blake2b(digest_size=8)
        h.update(prev.to_bytes(8, "little"))
        for t in token_ids[start:start + block_tokens]:
            h.update(int(t).to_bytes(4, "little", signed=True))
        prev = int.from_bytes(h.digest(), "little") & 0x7FFF_FFFF_FFFF_FFFF
        out.append(prev)
    return out
