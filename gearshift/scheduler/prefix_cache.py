"""Prefix cache: a radix tree of token ids over KV slots (page size 1), pure CPU.

    root ─[1 5 9]─► A ─[2 2]─► B          each node owns the slots of its edge's tokens
                    └─[7 3 3 1]─► C        ref: running requests whose prefix runs through it
                                           (held nodes are never evicted)

    match(tokens)    longest cached prefix -> its slots and the node ending it (a node is
                     split where the match ends inside its edge)
    hold / release   a running request references the nodes of its matched path
    insert(tokens, slots) a finished, aborted or preempted request's committed tokens: new
                     tokens' slots pass to the tree; slots of tokens already cached (the
                     request computed them itself) come back to be freed
    evict(n)         unreferenced leaves, least recently used first, until n slots are free

Only committed tokens enter the tree. `draft_rows` per node counts its leading tokens whose
draft state (the draft's KV at the same slots) the inserting request had computed: a hit
reuses the draft's rows only that far (speculative/draft_follow.py catches up the rest).

Data flow: Scheduler admission -> match + hold; Scheduler release -> insert; SlotPool.alloc
-> evict when the free list is short. Invariant: idle => free + cached == total.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field


@dataclass(eq=False)
class Node:
    key: list[int] = field(default_factory=list)  # token ids of the edge into this node
    slots: list[int] = field(default_factory=list)  # their KV slots
    draft_rows: int = 0  # leading tokens of `key` whose draft rows were computed
    parent: Node | None = None
    children: dict[int, Node] = field(default_factory=dict)  # first token -> child
    ref: int = 0  # running requests holding this node
    last_used: int = 0  # LRU clock


@dataclass(slots=True)
class Match:
    length: int  # tokens matched
    slots: list[int]
    node: Node  # the node the match ends at (hold it)
    draft_rows: int  # leading matched tokens with draft rows


class PrefixCache:
    def __init__(self) -> None:
        self.root = Node()
        self.root.ref = 1  # never evicted
        self._clock = itertools.count(1)
        self.num_slots = 0  # slots the tree owns
        self.num_held = 0  # of which held by running requests
        self.queries_tokens = 0  # prompt tokens looked up / found (metrics)
        self.hit_tokens = 0
        # told of every path cached and every leaf evicted (frontend/kv_events.py), or None
        self.listener = None

    @property
    def num_evictable(self) -> int:
        """Slots held only by the cache (kv_slots_cached)."""
        return self.num_slots - self.num_held

    # ------------------------------------------------------------ lookup
    def stats(self) -> dict:
        """Prompt tokens looked up in / served from the cache, and the hit rate."""
        q, h = self.queries_tokens, self.hit_tokens
        return {"queries_tokens": q, "hit_tokens": h, "hit_rate": h / q if q else 0.0}

    def match(self, tokens: list[int]) -> Match:
        node, i, slots, draft, full_draft = self.root, 0, [], 0, True
        now = next(self._clock)
        while i < len(tokens):
            child = node.children.get(tokens[i])
            if child is None:
                break
            n = _common(child.key, tokens, i)
            if n < len(child.key):
                child = self._split(child, n)
            child.last_used = now
            slots.extend(child.slots)
            if full_draft:
                draft += child.draft_rows
                full_draft = child.draft_rows == len(child.key)
            node, i = child, i + n
        self.queries_tokens += len(tokens)
        self.hit_tokens += i
        return Match(i, slots, node, draft)

    def evictable_on_path(self, node: Node) -> int:
        """Slots on the path to `node` that only the cache holds (what hold() would take)."""
        n = 0
        while node is not None:
            if node.ref == 0:
                n += len(node.slots)
            node = node.parent
        return n

    def depth(self, node: Node) -> int:
        """Tokens from the root to the end of `node`."""
        n = 0
        while node is not None:
            n += len(node.key)
            node = node.parent
        return n

    def hold(self, node: Node) -> int:
        """A running request references the path to `node`; -> slots that stopped being
        evictable."""
        newly = 0
        while node is not None:
            if node.ref == 0:
                newly += len(node.slots)
            node.ref += 1
            node = node.parent
        self.num_held += newly
        return newly

    def release(self, node: Node) -> None:
        now = next(self._clock)
        while node is not None:
            node.ref -= 1
            node.last_used = now
            if node.ref == 0:
                self.num_held -= len(node.slots)
            node = node.parent

    # ------------------------------------------------------------ insert / evict
    def insert(self, tokens: list[int], slots: list[int], draft_rows: int) -> list[int]:
        """Cache `tokens` at `slots` (draft rows computed for the first `draft_rows`); ->
        the slots the tree did not take (those tokens were cached already)."""
        node, i, dup = self.root, 0, []
        now = next(self._clock)
        while i < len(tokens):
            child = node.children.get(tokens[i])
            if child is None:
                leaf = Node(list(tokens[i:]), list(slots[i:]), max(0, min(draft_rows - i,
                                                                           len(tokens) - i)),
                            parent=node, last_used=now)
                node.children[tokens[i]] = leaf
                self.num_slots += len(leaf.slots)
                if self.listener is not None:
                    self.listener.stored(tokens)
                return dup
            n = _common(child.key, tokens, i)
            if n < len(child.key):
                child = self._split(child, n)
            own = slots[i:i + n]
            dup.extend(s for s, c in zip(own, child.slots) if s != c)
            if own == child.slots:  # its own slots: its draft may have computed more rows
                child.draft_rows = max(child.draft_rows, min(n, draft_rows - i))
            child.last_used = now
            node, i = child, i + n
        return dup

    def evict(self, n: int, batch: bool = False) -> list[int]:
        """Free at least n slots from unreferenced leaves, least recently used first
        (fewer if not enough are evictable); -> the slots. `batch`: at least 1/16 of what is
        evictable, so that an allocation-heavy stretch walks the tree once in many steps."""
        if batch:
            n = max(n, self.num_evictable // 16)
        leaves = [(x.last_used, id(x), x) for x in self._nodes() if not x.children and x.ref == 0]
        heapq.heapify(leaves)
        freed: list[int] = []
        while leaves and len(freed) < n:
            _, _, leaf = heapq.heappop(leaves)
            if self.listener is not None:
                self.listener.removed(self._path(leaf), len(leaf.key))
            freed.extend(leaf.slots)
            self.num_slots -= len(leaf.slots)
            parent = leaf.parent
            del parent.children[leaf.key[0]]
            if parent is not self.root and not parent.children and parent.ref == 0:
                heapq.heappush(leaves, (parent.last_used, id(parent), parent))
        return freed

    def clear(self) -> list[int]:
        """Evict everything no running request holds; -> the slots."""
        return self.evict(self.num_evictable)

    # ------------------------------------------------------------ internals
    def _split(self, child: Node, n: int) -> Node:
        """child's edge becomes [head: n tokens] -> [rest]; -> the head node."""
        head = Node(child.key[:n], child.slots[:n], min(child.draft_rows, n), child.parent,
                    {child.key[n]: child}, child.ref, child.last_used)
        child.parent.children[child.key[0]] = head
        child.key, child.slots = child.key[n:], child.slots[n:]
        child.draft_rows = max(0, child.draft_rows - n)
        child.parent = head
        return head

    def _path(self, node: Node) -> list[int]:
        """The token ids from the root to the end of `node`."""
        keys = []
        while node is not None:
            keys.append(node.key)
            node = node.parent
        return [t for key in reversed(keys) for t in key]

    def _nodes(self):
        stack = list(self.root.children.values())
        while stack:
            x = stack.pop()
            yield x
            stack.extend(x.children.values())


def _common(key: list[int], tokens: list[int], start: int) -> int:
    n = min(len(key), len(tokens) - start)
    for j in range(n):
        if key[j] != tokens[start + j]:
            return j
    return n
