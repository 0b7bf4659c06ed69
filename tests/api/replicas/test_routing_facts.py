"""Prompt-prefix hashes, response owners and the facts the ingress extracts from a body."""

from __future__ import annotations

import json

from api.replicas.forwarded import routing_facts
from api.replicas.prefix_hash import PREFIX_CHUNK_CHARS, prefix_hashes
from api.replicas.response_owner import owner_rank, path_response_id, replica_responses_db, response_id_prefix

SYSTEM = "You answer questions about the solar system. " * 40


def chat(system: str, user: str, model: str = "smollm2") -> dict:
    return {"model": model, "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}]}


def test_bodies_sharing_a_system_prompt_share_leading_hashes_only() -> None:
    a = prefix_hashes(chat(SYSTEM, "Which planet is largest? " * 20))
    b = prefix_hashes(chat(SYSTEM, "How far away is Mars? " * 20))
    shared = len(SYSTEM) // PREFIX_CHUNK_CHARS
    assert len(a) >= shared and a[:shared - 1] == b[:shared - 1]
    assert a != b and a[-1] not in b
    other = prefix_hashes(chat("Another assistant entirely. " * 60, "Which planet is largest?"))
    assert not set(other) & set(a)


def test_the_model_and_the_tools_are_part_of_the_prefix() -> None:
    base = prefix_hashes(chat(SYSTEM, "q"))
    assert not set(prefix_hashes(chat(SYSTEM, "q", model="my-adapter"))) & set(base)   # KV is keyed by adapter
    with_tools = {**chat(SYSTEM, "q"), "tools": [{"type": "function", "function": {"name": "f"}}]}
    assert prefix_hashes(with_tools)[0] != base[0]


def test_short_prompts_have_no_full_chunk() -> None:
    assert prefix_hashes(chat("Hi", "there")) == ()


def test_responses_and_messages_bodies_hash_their_system_fields() -> None:
    responses = {"model": "m", "instructions": SYSTEM, "input": "Hello"}
    messages = {"model": "m", "system": SYSTEM, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4}
    assert len(prefix_hashes(responses)) >= 7 and len(prefix_hashes(messages)) >= 7


def test_response_ids_carry_their_owner_rank() -> None:
    assert response_id_prefix(3) == "resp_r3_"
    assert owner_rank("resp_r3_" + "ab" * 16) == 3
    assert owner_rank("resp_" + "ab" * 16) is None and owner_rank(None) is None and owner_rank("resp_rx_1") is None
    for path in ("/v1/responses/resp_r1_x", "/v1/responses/resp_r1_x/cancel", "/v1/responses/resp_r1_x/input_items"):
        assert path_response_id(path) == "resp_r1_x"
    assert path_response_id("/v1/responses") is None and path_response_id("/v1/chat/completions") is None


def test_each_rank_has_its_own_store_file(tmp_path) -> None:
    assert replica_responses_db(":memory:", 1) == ":memory:"
    assert replica_responses_db("postgresql://u@h:5432/db", 1) == "postgresql://u@h:5432/db"   # shared
    assert replica_responses_db(str(tmp_path / "responses.sqlite3"), 1) == str(tmp_path / "responses.r1.sqlite3")


def test_routing_facts_of_requests() -> None:
    body = json.dumps({"model": "ad-a", "input": SYSTEM, "previous_response_id": "resp_r1_abc"}).encode()
    facts = routing_facts("POST", "/v1/responses", body)
    assert facts.owner_rank == 1 and facts.model == "ad-a" and len(facts.prefix_hashes) >= 7
    assert routing_facts("POST", "/v1/responses/resp_r0_abc/cancel", b"").owner_rank == 0
    assert routing_facts("GET", "/v1/responses/resp_r2_abc", b"").owner_rank == 2
    for bad in (b"{not json", b"[1, 2]", b"\xff\xfe"):   # the replica answers these with the API's 400
        assert routing_facts("POST", "/v1/chat/completions", bad).model is None
