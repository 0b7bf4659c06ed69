"""The routing policy, as a pure function of the replicas' state and the request's facts.

In order (issue 16 item 2):
1. a request for one replica (`target_rank`: the ingress's /health and /metrics fan-out) goes there;
   while no live replica has that rank it is routed like any other request, and the ingress,
   reading `x-structserve-replica` on the answer, counts the rank as down (a router that returned
   no replica would leave Serve retrying it forever, cancelled or not);
2. a request naming a stored response goes to the replica owning it (`owner_rank`) while that
   replica is alive, and to no other (no other replica holds the response);
3. a request naming an adapter that some replicas have loaded goes to one of those (the others
   would answer 404: a replica Serve restarted has lost the adapters loaded at run time); the
   rules below then choose among them;
4. the replica whose recorded prompt prefixes match the most leading chunks of this prompt
   (`PrefixIndex`), if any matches;
5. else, or when the preferred replica's queue is longer than the least-loaded replica's by more
   than `imbalance_threshold` requests (so one hot system prompt cannot pin every request to one
   replica), the least loaded one (fewest ongoing requests; ties: the one routed to least, so
   unrelated requests alternate).
The rest follow in least-loaded order (replicas without the adapter last), for Serve to try when
the first one's queue is full.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from api.replicas.forwarded import RoutingFacts
from api.replicas.prefix_index import PrefixIndex

# Ray Serve LLM's PrefixCacheAffinityRouter's default `imbalanced_threshold`. 4 measured worse on
# replicas_bench at concurrency 8 (README, Performance): a hit on a busy replica costs one more
# sequence in its batch, a miss on an idle one a whole ~1,000-token prefill, and the miss copies the
# prompt to a second cache, which a memory-bound replica pays for in evictions.
DEFAULT_IMBALANCE_THRESHOLD = 10


@dataclass(frozen=True, slots=True)
class CandidateState:
    """One live replica as the router sees it: `key` its Serve replica id, `rank` the rank it reports
    (None before its first routing stats), `queue_len` its ongoing requests, `adapters` the LoRA
    adapter names it has loaded, `num_routed` requests this router has sent it."""

    key: Hashable
    rank: int | None
    queue_len: int
    adapters: frozenset[str]
    num_routed: int


def order_candidates(candidates: Sequence[CandidateState], facts: RoutingFacts, index: PrefixIndex,
                     imbalance_threshold: int = DEFAULT_IMBALANCE_THRESHOLD) -> list[CandidateState]:
    """The candidates to try, most preferred first (rules in the module docstring); empty only when
    there are no candidates. Raises ValueError for a negative threshold."""
    if imbalance_threshold < 0:
        raise ValueError(f"imbalance_threshold must be >= 0, not {imbalance_threshold}")
    for rank in (facts.target_rank, facts.owner_rank):
        chosen = [c for c in candidates if rank is not None and c.rank == rank]
        if chosen:
            return chosen
    by_load = sorted(candidates, key=lambda c: (c.queue_len, c.num_routed))
    if not by_load:
        return []
    holders = [c for c in by_load if facts.model is not None and facts.model in c.adapters]
    pool = holders or by_load
    preferred = _longest_prefix(pool, facts, index)
    first = pool[0]
    if preferred is not None and preferred.queue_len - first.queue_len <= imbalance_threshold:
        first = preferred
    return [first, *(c for c in pool if c is not first), *(c for c in by_load if c not in pool)]


def _longest_prefix(by_load: list[CandidateState], facts: RoutingFacts, index: PrefixIndex) -> CandidateState | None:
    """The least loaded of the replicas with the longest prefix match; None when none matches."""
    matches = [index.match_length(c.key, facts.prefix_hashes) for c in by_load]
    best = max(matches)
    return by_load[matches.index(best)] if best > 0 else None
