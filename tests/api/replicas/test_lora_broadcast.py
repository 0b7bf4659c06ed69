"""Combining every replica's answer to a run-time LoRA load or unload (`api/replicas/lora_broadcast.py`)."""

from __future__ import annotations

import json

import pytest

from api.replicas.forwarded import ForwardedRequest
from api.replicas.lora_broadcast import LOAD_PATH, UNLOAD_PATH, ReplicaAnswer, combine, is_lora_broadcast, rollback_request

LOAD = json.dumps({"lora_name": "sql", "lora_path": "/adapters/sql"}).encode()
OK = ReplicaAnswer(200, (), b"Success")
BAD_FOLDER = ReplicaAnswer(400, (), b'{"error": {"message": "no adapter_config.json"}}')
NOT_LOADED = ReplicaAnswer(404, (), b'{"error": {"code": "model_not_found"}}')


def test_only_the_two_lora_routes_are_broadcast() -> None:
    assert is_lora_broadcast("POST", LOAD_PATH) and is_lora_broadcast("POST", UNLOAD_PATH + "/")
    assert not is_lora_broadcast("GET", LOAD_PATH) and not is_lora_broadcast("POST", "/v1/chat/completions")


def test_a_load_succeeds_only_on_every_replica_and_is_undone_otherwise() -> None:
    assert combine(LOAD_PATH, LOAD, [OK, OK]).answer is OK
    refused = combine(LOAD_PATH, LOAD, [OK, BAD_FOLDER, OK])
    assert refused.answer is BAD_FOLDER and refused.rollback == (0, 2) and refused.missing == ()
    down = combine(LOAD_PATH, LOAD, [None, OK])
    assert down.answer is None and down.missing == (0,) and down.rollback == (1,)
    inplace = json.dumps({"lora_name": "sql", "lora_path": "/a", "load_inplace": True}).encode()
    assert combine(LOAD_PATH, inplace, [OK, BAD_FOLDER]).rollback == ()   # the old weights are gone already


def test_an_unload_succeeds_where_no_answering_replica_keeps_the_adapter() -> None:
    body = json.dumps({"lora_name": "sql"}).encode()
    assert combine(UNLOAD_PATH, body, [OK, NOT_LOADED]).answer is OK   # a restarted replica never had it
    assert combine(UNLOAD_PATH, body, [NOT_LOADED, NOT_LOADED]).answer is NOT_LOADED
    down = combine(UNLOAD_PATH, body, [OK, None])
    assert down.answer is None and down.missing == (1,) and down.rollback == ()
    with pytest.raises(ValueError):
        combine(UNLOAD_PATH, body, [])


def test_the_rollback_is_an_unload_of_the_same_name_for_one_rank() -> None:
    load = ForwardedRequest("POST", LOAD_PATH, b"x=1", ((b"authorization", b"Bearer k"),
                                                         (b"content-length", str(len(LOAD)).encode())), LOAD)
    undo = rollback_request(load, 1)
    assert undo.path == UNLOAD_PATH and json.loads(undo.body) == {"lora_name": "sql"} and undo.facts.target_rank == 1
    assert dict(undo.headers) == {b"authorization": b"Bearer k", b"content-length": str(len(undo.body)).encode()}
