"""Radix tree: prefix matching, locking, LRU eviction and the host tier."""

from __future__ import annotations

import random

from sim.radix import RadixTree


def test_match_insert_and_split() -> None:
    tree = RadixTree()
    added, _node = tree.insert((1, 2, 3, 4), 0.0)
    assert added == 4 and tree.device_tokens == 4
    assert tree.match_prefix((1, 2, 9), 1.0).device_len == 2  # splits the node at 2
    added, _ = tree.insert((1, 2, 7, 8), 2.0)
    assert added == 2 and tree.device_tokens == 6
    m = tree.match_prefix((1, 2, 3, 4, 5), 3.0)
    assert (m.device_len, m.host_len) == (4, 0)
    tree.check()


def test_locked_tokens_are_not_evictable() -> None:
    tree = RadixTree()
    _, a = tree.insert((1, 2, 3), 0.0)
    tree.insert((5, 6), 1.0)
    tree.lock(a)
    assert tree.evictable_tokens == 2
    assert tree.evict(10) == 2
    assert tree.device_tokens == 3
    tree.unlock(a)
    assert tree.evictable_tokens == 3
    tree.check()


def test_eviction_is_least_recently_used() -> None:
    tree = RadixTree()
    tree.insert((1, 1), 0.0)
    tree.insert((2, 2), 1.0)
    tree.match_prefix((1, 1), 5.0)  # touch the older one
    tree.evict(2)
    assert tree.match_prefix((1, 1), 6.0).device_len == 2
    assert tree.match_prefix((2, 2), 6.0).device_len == 0


def test_host_tier_keeps_evicted_prefixes() -> None:
    tree = RadixTree(host_capacity=100, write_policy="write_through")
    tree.insert(tuple(range(10)), 0.0)
    assert tree.host_tokens == 10  # write-through backs up at insert
    tree.evict(10)
    m = tree.match_prefix(tuple(range(12)), 1.0)
    assert (m.device_len, m.host_len) == (0, 10)
    tree.lock(m.last_node)
    tree.load_back(m, 2.0)
    assert tree.device_tokens == 10 and tree.evictable_tokens == 0
    tree.unlock(m.last_node)
    tree.check()


def test_write_back_copies_on_eviction_and_host_is_bounded() -> None:
    tree = RadixTree(host_capacity=15, write_policy="write_back")
    tree.insert(tuple(range(10)), 0.0)
    assert tree.host_tokens == 0
    tree.evict(10)
    assert tree.host_tokens == 10
    tree.insert(tuple(range(100, 110)), 1.0)
    tree.evict(10)  # host holds 15: the older host-only prefix is dropped
    assert tree.host_tokens == 10
    assert tree.match_prefix(tuple(range(10)), 2.0).host_len == 0
    tree.check()


def test_random_operations_keep_counters_consistent() -> None:
    rng = random.Random(5)
    tree = RadixTree(host_capacity=300, write_policy="write_through")
    locked = []
    for step in range(2000):
        seq = tuple(rng.randrange(4) for _ in range(rng.randrange(1, 30)))
        op = rng.random()
        if op < 0.5:
            tree.insert(seq, float(step))
        elif op < 0.7:
            m = tree.match_prefix(seq, float(step))
            tree.lock(m.last_node)
            locked.append(m.last_node)
        elif op < 0.85 and locked:
            tree.unlock(locked.pop(rng.randrange(len(locked))))
        else:
            tree.evict(rng.randrange(1, 40))
        if step % 100 == 0:
            tree.check()
    tree.check()
