"""A radix (prefix) tree over token ids with the device/host tiers of SGLang's HiRadixCache.

Each node holds a run of token ids. A node's KV can live on the GPU (`on_device`), in the host pool
(`on_host`), or both. Running requests lock the path to their prefix; unlocked device tokens are
*evictable* and count as free for admission, exactly like SGLang's `evictable_size()`. Eviction
takes least-recently-used device leaves; with the hierarchical cache a backed-up node keeps its
host copy and can be loaded back later instead of recomputed.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator
from dataclasses import dataclass

Tokens = tuple[int, ...]


class Node:
    __slots__ = (
        "children",
        "hits",
        "key",
        "last_access",
        "lock_ref",
        "on_device",
        "on_host",
        "parent",
        "uid",
    )

    _ids = itertools.count()

    def __init__(self, key: Tokens, parent: Node | None) -> None:
        self.key = key
        self.parent = parent
        self.children: dict[int, Node] = {}
        self.lock_ref = 0
        self.last_access = 0.0
        self.on_device = True
        self.on_host = False
        self.hits = 0
        self.uid = next(Node._ids)

    def __lt__(self, other: Node) -> bool:
        return self.uid < other.uid


@dataclass
class Match:
    """Result of a prefix lookup: `device_len` tokens are on the GPU, then `host_len` on host."""

    device_len: int
    host_len: int
    device_node: Node  # deepest node whose KV is on the GPU (root if none)
    last_node: Node  # deepest matched node (may be host-only)


class RadixTree:
    def __init__(self, host_capacity: int = 0, write_policy: str = "write_through") -> None:
        self.root = Node((), None)
        self.root.lock_ref = 1
        self.device_tokens = 0  # tokens whose KV is on the GPU
        self.evictable_tokens = 0  # device tokens with lock_ref == 0
        self.host_capacity = host_capacity
        self.host_tokens = 0
        self.write_policy = write_policy
        self.backed_up_total = 0  # tokens written to host (metrics)
        self.host_evicted_total = 0
        self.device_evicted_total = 0

    @property
    def hierarchical(self) -> bool:
        return self.host_capacity > 0

    # ----- lookup -----
    def match_prefix(self, tokens: Tokens, now: float) -> Match:
        node = self.root
        device_node = self.root
        device_len = 0
        host_len = 0
        pos = 0
        while pos < len(tokens):
            child = node.children.get(tokens[pos])
            if child is None:
                break
            key = child.key
            n = _common_prefix(key, tokens, pos)
            if n < len(key):
                child = self._split(child, n)
            child.last_access = now
            child.hits += 1
            if child.on_device and host_len == 0:
                device_len += n
                device_node = child
            elif child.on_host:
                host_len += n
            else:  # pragma: no cover - structure invariant
                break
            node = child
            pos += n
            if n < len(key):
                break
        if self.write_policy == "write_through_selective":
            self._selective_backup(device_node)
        return Match(device_len, host_len, device_node, node)

    def _split(self, child: Node, n: int) -> Node:
        """Split `child` so that its first n tokens become a new parent node; return that node."""
        parent = child.parent
        assert parent is not None
        head = Node(child.key[:n], parent)
        head.on_device = child.on_device
        head.on_host = child.on_host
        head.lock_ref = child.lock_ref
        head.last_access = child.last_access
        head.hits = child.hits
        parent.children[child.key[0]] = head
        child.key = child.key[n:]
        child.parent = head
        head.children[child.key[0]] = child
        return head

    # ----- locking -----
    def lock(self, node: Node) -> None:
        while node is not self.root:
            if node.lock_ref == 0 and node.on_device:
                self.evictable_tokens -= len(node.key)
            node.lock_ref += 1
            parent = node.parent
            assert parent is not None
            node = parent

    def unlock(self, node: Node) -> None:
        while node is not self.root:
            node.lock_ref -= 1
            if node.lock_ref == 0 and node.on_device:
                self.evictable_tokens += len(node.key)
            parent = node.parent
            assert parent is not None
            node = parent

    # ----- insertion -----
    def insert(self, tokens: Tokens, now: float) -> tuple[int, Node]:
        """Insert a sequence whose KV is on the GPU; return (tokens newly added, last node).

        Tokens along the path that were host-only become device-resident again (the caller has
        just computed or loaded them).
        """
        node = self.root
        pos = 0
        added = 0
        while pos < len(tokens):
            child = node.children.get(tokens[pos])
            if child is None:
                new = Node(tokens[pos:], node)
                new.last_access = now
                node.children[tokens[pos]] = new
                self.device_tokens += len(new.key)
                self.evictable_tokens += len(new.key)
                added += len(new.key)
                if self.hierarchical and self.write_policy == "write_through":
                    self._backup(new)
                return added, new
            n = _common_prefix(child.key, tokens, pos)
            if n < len(child.key):
                child = self._split(child, n)
            child.last_access = now
            if not child.on_device:
                child.on_device = True
                self.device_tokens += n
                if child.lock_ref == 0:
                    self.evictable_tokens += n
                added += n
            node = child
            pos += n
        return added, node

    def load_back(self, match: Match, now: float) -> Node:
        """Make the host-only part of a match device-resident (the caller allocated the space)."""
        node: Node | None = match.last_node
        path: list[Node] = []
        while node is not None and node is not match.device_node and node is not self.root:
            path.append(node)
            node = node.parent
        for n in path:
            if not n.on_device:
                n.on_device = True
                self.device_tokens += len(n.key)
                if n.lock_ref == 0:
                    self.evictable_tokens += len(n.key)
            n.last_access = now
        return match.last_node

    # ----- host tier -----
    def _backup(self, node: Node) -> bool:
        if node.on_host:
            return True
        need = len(node.key)
        if self.host_tokens + need > self.host_capacity:
            self._evict_host(self.host_tokens + need - self.host_capacity)
        if self.host_tokens + need > self.host_capacity:
            return False
        node.on_host = True
        self.host_tokens += need
        self.backed_up_total += need
        return True

    def _selective_backup(self, node: Node) -> None:
        while node is not self.root and node.hits >= 2 and not node.on_host:
            self._backup(node)
            parent = node.parent
            assert parent is not None
            node = parent

    def _evict_host(self, num_tokens: int) -> int:
        freed = 0
        heap = [(n.last_access, n) for n in self._nodes() if self._host_leaf(n)]
        heapq.heapify(heap)
        while freed < num_tokens and heap:
            _, node = heapq.heappop(heap)
            if not self._host_leaf(node):
                continue
            freed += len(node.key)
            self.host_tokens -= len(node.key)
            self.host_evicted_total += len(node.key)
            parent = node.parent
            assert parent is not None
            del parent.children[node.key[0]]
            if parent is not self.root and self._host_leaf(parent):
                heapq.heappush(heap, (parent.last_access, parent))
        return freed

    def _host_leaf(self, node: Node) -> bool:
        return (
            node is not self.root
            and node.on_host
            and not node.on_device
            and node.lock_ref == 0
            and not node.children
        )

    # ----- device eviction -----
    def evict(self, num_tokens: int) -> int:
        """Free at least `num_tokens` device tokens from unlocked LRU leaves; return the count."""
        if num_tokens <= 0 or self.evictable_tokens <= 0:
            return 0
        freed = 0
        heap = [(n.last_access, n) for n in self._nodes() if self._device_leaf(n)]
        heapq.heapify(heap)
        while freed < num_tokens and heap:
            _, node = heapq.heappop(heap)
            if not self._device_leaf(node):
                continue
            size = len(node.key)
            freed += size
            self.device_tokens -= size
            self.evictable_tokens -= size
            self.device_evicted_total += size
            parent = node.parent
            assert parent is not None
            if self.hierarchical and (node.on_host or self._backup(node)):
                node.on_device = False
            else:
                self._drop_subtree(node)
            if parent is not self.root and self._device_leaf(parent):
                heapq.heappush(heap, (parent.last_access, parent))
        return freed

    def _drop_subtree(self, node: Node) -> None:
        """Delete a node that is leaving the device with no host copy, plus host-only children."""
        parent = node.parent
        assert parent is not None
        del parent.children[node.key[0]]
        stack = list(node.children.values())
        if node.on_host:
            self.host_tokens -= len(node.key)
        while stack:
            n = stack.pop()
            if n.on_host:
                self.host_tokens -= len(n.key)
            stack.extend(n.children.values())

    def _device_leaf(self, node: Node) -> bool:
        if node is self.root or not node.on_device or node.lock_ref > 0:
            return False
        return not any(c.on_device for c in node.children.values())

    def _nodes(self) -> Iterator[Node]:
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def reset(self) -> None:
        """`/flush_cache`: drop every node (only allowed when nothing is locked)."""
        self.root.children.clear()
        self.device_tokens = 0
        self.evictable_tokens = 0
        self.host_tokens = 0

    def check(self) -> None:
        """Recount everything from scratch and compare (used by tests)."""
        device = evictable = host = 0
        for n in self._nodes():
            if n.on_device:
                device += len(n.key)
                if n.lock_ref == 0:
                    evictable += len(n.key)
            if n.on_host:
                host += len(n.key)
        assert (device, evictable, host) == (
            self.device_tokens,
            self.evictable_tokens,
            self.host_tokens,
        ), (
            (device, evictable, host),
            (self.device_tokens, self.evictable_tokens, self.host_tokens),
        )


def _common_prefix(key: Tokens, tokens: Tokens, pos: int) -> int:
    """Length of the common prefix of `key` and `tokens[pos:]`."""
    limit = min(len(key), len(tokens) - pos)
    if tokens[pos : pos + limit] == key[:limit]:
        return limit
    lo, hi = 0, limit  # binary search on slices keeps the comparison in C
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if tokens[pos : pos + mid] == key[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo
