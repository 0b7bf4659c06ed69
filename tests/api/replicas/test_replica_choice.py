"""The routing policy (`api/replicas/replica_choice.py`) on plain replica states."""

from __future__ import annotations

import pytest

from api.replicas.forwarded import RoutingFacts
from api.replicas.prefix_index import PrefixIndex
from api.replicas.replica_choice import CandidateState, order_candidates

PROMPT = (b"h1", b"h2", b"h3", b"h4")


def replica(key: str, rank: int, queue_len: int = 0, adapters: tuple[str, ...] = (), num_routed: int = 0):
    return CandidateState(key, rank, queue_len, frozenset(adapters), num_routed)


def first(candidates, facts, index=None, threshold: int = 4) -> str:
    return order_candidates(candidates, facts, index or PrefixIndex(), threshold)[0].key


def test_the_owner_of_a_stored_response_wins_over_everything_while_alive() -> None:
    index = PrefixIndex()
    index.record("a", PROMPT)
    replicas = [replica("a", 0), replica("b", 1, queue_len=50)]
    facts = RoutingFacts(owner_rank=1, prefix_hashes=PROMPT)
    assert [c.key for c in order_candidates(replicas, facts, index)] == ["b"]
    assert first(replicas, RoutingFacts(owner_rank=7, prefix_hashes=PROMPT), index) == "a"   # owner gone


def test_a_targeted_request_goes_to_its_rank_or_falls_back_to_routing() -> None:
    replicas = [replica("a", 0), replica("b", 1, queue_len=3)]
    assert [c.key for c in order_candidates(replicas, RoutingFacts(target_rank=1), PrefixIndex())] == ["b"]
    assert first(replicas, RoutingFacts(target_rank=5)) == "a"   # the ingress sees the rank in the answer


def test_the_longest_recorded_prefix_wins() -> None:
    index = PrefixIndex()
    index.record("a", PROMPT[:2])
    index.record("b", PROMPT[:3] + (b"other",))
    replicas = [replica("a", 0), replica("b", 1, queue_len=2)]
    assert first(replicas, RoutingFacts(prefix_hashes=PROMPT), index) == "b"
    assert first(replicas, RoutingFacts(prefix_hashes=(b"h9",)), index) == "a"


def test_past_the_imbalance_threshold_the_least_loaded_replica_gets_the_request() -> None:
    index = PrefixIndex()
    index.record("b", PROMPT)
    facts = RoutingFacts(prefix_hashes=PROMPT)
    assert first([replica("a", 0), replica("b", 1, queue_len=4)], facts, index, threshold=4) == "b"
    assert first([replica("a", 0), replica("b", 1, queue_len=5)], facts, index, threshold=4) == "a"
    assert first([replica("a", 0, queue_len=3), replica("b", 1, queue_len=7)], facts, index, threshold=4) == "b"


def test_an_adapter_request_goes_to_a_replica_that_has_the_adapter_loaded() -> None:
    replicas = [replica("a", 0), replica("b", 1, queue_len=1, adapters=("sql",))]
    assert first(replicas, RoutingFacts(model="sql")) == "b"
    assert first(replicas, RoutingFacts(model="smollm2")) == "a"
    index = PrefixIndex()
    index.record("a", PROMPT)   # a prefix match or a long queue never sends it where it would be a 404
    busy = [replica("a", 0), replica("b", 1, queue_len=9, adapters=("sql",))]
    assert [c.key for c in order_candidates(busy, RoutingFacts(model="sql", prefix_hashes=PROMPT), index)] == ["b", "a"]
    both = [replica("a", 0, queue_len=2, adapters=("sql",)), replica("b", 1, adapters=("sql",)), replica("c", 2)]
    assert first(both, RoutingFacts(model="sql")) == "b"   # among the holders: the usual rules


def test_unrelated_requests_alternate_between_idle_replicas() -> None:
    assert first([replica("a", 0, num_routed=3), replica("b", 1, num_routed=2)], RoutingFacts()) == "b"
    ordered = order_candidates([replica("a", 0, queue_len=2), replica("b", 1), replica("c", 2, queue_len=1)],
                               RoutingFacts(), PrefixIndex())
    assert [c.key for c in ordered] == ["b", "c", "a"]   # the rest in least-loaded order, for Serve's retries


def test_no_candidates_and_bad_thresholds() -> None:
    assert order_candidates([], RoutingFacts(), PrefixIndex()) == []
    with pytest.raises(ValueError, match="imbalance_threshold"):
        order_candidates([replica("a", 0)], RoutingFacts(), PrefixIndex(), -1)


def test_prefix_index_forgets_least_recent_digests_and_dead_replicas() -> None:
    index = PrefixIndex(max_entries_per_replica=3)
    index.record("a", PROMPT)
    assert index.num_entries("a") == 3 and index.match_length("a", PROMPT) == 0   # h1 forgotten: the chain breaks
    assert index.match_length("a", PROMPT[1:]) == 3
    index.forget("a")
    assert index.match_length("a", PROMPT[1:]) == 0
    with pytest.raises(ValueError):
        PrefixIndex(0)
