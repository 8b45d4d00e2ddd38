"""The server's instance cache: one generation per key, LRU eviction, aliases share an entry."""

from __future__ import annotations

import threading

from mechsandbox.server.instance_cache import InstanceCache


def test_hits_misses_aliases_and_eviction() -> None:
    cache = InstanceCache(maxsize=2)
    a = cache.get("dead-neurons", 1, "easy")
    assert cache.get("task1", 1, "easy") is a  # the alias maps to the same entry
    cache.get("dead-neurons", 2, "easy")
    cache.get("dead-neurons", 3, "easy")
    assert len(cache) == 2 and (cache.hits, cache.misses) == (1, 3)
    assert cache.get("dead-neurons", 1, "easy") is not a  # evicted, regenerated (identical content)
    assert cache.get("dead-neurons", 1, "easy").payload.blob == a.payload.blob


def test_concurrent_misses_generate_once() -> None:
    cache = InstanceCache()
    results = []
    threads = [threading.Thread(target=lambda: results.append(cache.get("copy-head", 5, "easy"))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert cache.misses == 1 and all(r is results[0] for r in results)


def test_payload_carries_no_truth_or_seed() -> None:
    item = InstanceCache().get("induction-circuit", 7, "medium")
    header = repr(item.payload.header)
    assert "truth" not in header and "seed" not in header
    assert set(item.payload.header) == {"arch", "probe", "helpers"}
