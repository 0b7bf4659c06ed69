"""Logprobs list exactly the returned text's tokens, and cache_salt keeps prefix-cache blocks apart,
on the real SmolLM2 server (the shared `server`, through the shared `batch`; streams read by the
official openai client).

Logprobs, checked token by token against the returned text: their `bytes` joined are the content
(no end-of-turn entry, also with a json_schema response_format), every value is finite, and at
temperature 0 the sampled token is the first alternative, so the alternatives are those after the
grammar mask. Paths: chat whole and streamed with json_schema, chat with a stop string that starts
and ends inside tokens (whole and streamed), n=2, non-ASCII text, a forced tool call (no content
logprobs), /v1/completions whole and streamed (tokens, text_offset), and Responses with include
["message.output_text.logprobs"] whole and streamed. cache_salt: usage's cached_tokens show that
requests share prefix blocks only with the same salt (or both none).
"""

from __future__ import annotations

import math
import uuid
from typing import Any

import pytest

from tests.e2e.cases_support import (
    Jobs,
    chat_url,
    completions_url,
    post,
    responses_url,
    straddling_stop,
)

pytestmark = pytest.mark.slow

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
          "required": ["city", "population"], "additionalProperties": False}
JSON_FORMAT = {"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA, "strict": True}}
ASK = [{"role": "user", "content": "Give the capital of France and its population as JSON."}]
CHAT = {"model": "default", "temperature": 0, "max_tokens": 24, "logprobs": True, "top_logprobs": 3}
TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                         "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                        "required": ["city"]}}}


def chat_stream(client, **body: Any) -> tuple[str, list[dict[str, Any]], str | None]:
    """(content, logprob entries as dicts, finish_reason) of one streamed chat choice, via the SDK."""
    content, entries, finish = "", [], None
    for chunk in client.chat.completions.create(**body, stream=True):
        for choice in chunk.choices:
            content += choice.delta.content or ""
            if choice.logprobs is not None:
                entries += [e.model_dump() for e in choice.logprobs.content or []]
            finish = choice.finish_reason or finish
    return content, entries, finish


def _stop_job(server) -> dict[str, Any]:
    """A free reference, then its stop string S (from inside one token to inside a later one),
    whole and streamed."""
    body = {**CHAT, "messages": [{"role": "user", "content": "Describe a sunny day at the beach."}]}
    ref = post(chat_url(server), body).json()["choices"][0]
    stop = straddling_stop([e["token"] for e in ref["logprobs"]["content"]])
    whole = post(chat_url(server), {**body, "stop": [stop]}).json()["choices"][0]
    return {"reference": ref, "stop": stop, "whole": whole, "stream": chat_stream(server.client(), **body, stop=[stop])}


def _salt_job(server, url: str, body: dict[str, Any]) -> dict[str, int]:
    """cached_tokens of the same (fresh) long prompt sent in turn with salts a, b, none, a, none
    (fresh salts too: the endpoints' chat templates begin alike)."""
    details = "input_tokens_details" if url.endswith("responses") else "prompt_tokens_details"
    cached = {}
    a, b = f"tenant-a-{uuid.uuid4().hex}", f"tenant-b-{uuid.uuid4().hex}"
    for name, salt in (("a", a), ("b", b), ("none", None), ("a_again", a), ("none_again", None)):
        extra = {"cache_salt": salt} if salt is not None else {}
        usage = post(url, {**body, **extra}).json()["usage"]
        cached[name] = usage[details]["cached_tokens"]
    return cached


def _long_prompt() -> str:
    marker = uuid.uuid4().hex   # fresh per run: no earlier request can have cached it
    return f"[{marker}] " + " ".join(f"Rule {i}: answer briefly and politely." for i in range(12)) + " Say hi."


def batch_jobs(server) -> Jobs:
    """This file's requests for the shared `batch`."""
    client = server.client()
    json_body = {**CHAT, "messages": ASK, "max_tokens": 40, "response_format": JSON_FORMAT}
    cmpl = {"model": "default", "prompt": "The three primary colours are", "temperature": 0, "max_tokens": 12,
            "logprobs": 2}
    resp = {"model": "default", "input": "Name a fruit.", "temperature": 0, "max_output_tokens": 12,
            "include": ["message.output_text.logprobs"], "top_logprobs": 2}
    return {
        "lp/json": lambda: post(chat_url(server), json_body).json(),
        "lp/json_stream": lambda: chat_stream(client, **json_body),
        "lp/stop": lambda: _stop_job(server),
        "lp/n2": lambda: post(chat_url(server), {**CHAT, "messages": ASK, "n": 2, "temperature": 0.8,
                                                 "seed": 7, "max_tokens": 12}).json(),
        "lp/unicode": lambda: post(chat_url(server), {**CHAT, "max_tokens": 12, "messages": [
            {"role": "user", "content": "日本の首都はどこですか？日本語で答えてください。"}]}).json(),
        "lp/tool": lambda: post(chat_url(server), {**CHAT, "messages": [
            {"role": "user", "content": "What is the weather in Paris?"}], "max_tokens": 40, "tools": [TOOL],
            "tool_choice": "required"}).json(),
        "lp/cmpl": lambda: post(completions_url(server), cmpl).json(),
        "lp/cmpl_stream": lambda: [c.model_dump() for c in client.completions.create(**cmpl, stream=True)],
        "lp/resp": lambda: post(responses_url(server), resp).json(),
        "lp/resp_stream": lambda: [e.model_dump() for e in client.responses.create(**resp, stream=True)],
        "lp/salt_chat": lambda: _salt_job(server, chat_url(server), {
            "model": "default", "messages": [{"role": "user", "content": _long_prompt()}], "max_tokens": 1}),
        "lp/salt_cmpl": lambda: _salt_job(server, completions_url(server), {
            "model": "default", "prompt": _long_prompt(), "max_tokens": 1}),
        "lp/salt_resp": lambda: _salt_job(server, responses_url(server), {
            "model": "default", "input": _long_prompt(), "max_output_tokens": 1}),
    }


def is_utf8(data: bytes) -> bool:
    """True when `data` is whole UTF-8 characters."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def check_entries(content: str, entries: list[dict[str, Any]], greedy: bool = True) -> None:
    """The entries' bytes joined are `content`; every logprob is finite and <= 0; greedy: the
    sampled token is the best alternative (those are taken after the grammar mask)."""
    assert bytes(b for e in entries for b in e["bytes"]).decode() == content, (content, entries)
    for e in entries:
        values = [e["logprob"]] + [t["logprob"] for t in e["top_logprobs"]]
        assert all(math.isfinite(v) and -9999.0 < v <= 0 for v in values), e
        if greedy and e["top_logprobs"]:
            assert e["top_logprobs"][0]["logprob"] == pytest.approx(e["logprob"], abs=1e-4), e


def test_json_schema_logprobs_are_the_content_tokens(batch):
    whole = batch["lp/json"]
    choice = whole["choices"][0]
    entries = choice["logprobs"]["content"]
    check_entries(choice["message"]["content"], entries)
    ended_by_eos = choice["finish_reason"] == "stop"
    assert len(entries) == whole["usage"]["completion_tokens"] - ended_by_eos, (choice, whole["usage"])
    content, streamed, finish = batch["lp/json_stream"]
    assert (content, finish) == (choice["message"]["content"], choice["finish_reason"])
    assert [e["token"] for e in streamed] == [e["token"] for e in entries]
    assert [e["logprob"] for e in streamed] == pytest.approx([e["logprob"] for e in entries], abs=1e-3)


def test_stop_string_cuts_the_token_it_starts_in(batch):
    """The entries are the reference's up to the token the stop string starts in, which keeps its
    logprob with its token cut to the part before the stop string; whole and streamed alike."""
    result = batch["lp/stop"]
    ref = result["reference"]["logprobs"]["content"]
    for content, entries, finish in [(result["whole"]["message"]["content"], result["whole"]["logprobs"]["content"],
                                      result["whole"]["finish_reason"]), result["stream"]]:
        assert finish == "stop" and content == result["reference"]["message"]["content"][
            :result["reference"]["message"]["content"].index(result["stop"])]
        check_entries(content, entries)
        *kept, last = entries
        assert [e["token"] for e in kept] == [e["token"] for e in ref[:len(kept)]]
        cut = ref[len(kept)]
        assert cut["token"].startswith(last["token"]) and last["token"] != cut["token"], (last, cut)
        assert last["logprob"] == pytest.approx(cut["logprob"], abs=1e-3)


def test_n2_and_non_ascii_logprobs_match_each_content(batch):
    for choice in batch["lp/n2"]["choices"]:
        check_entries(choice["message"]["content"], choice["logprobs"]["content"], greedy=False)
    choice = batch["lp/unicode"]["choices"][0]
    assert not choice["message"]["content"].isascii(), choice
    entries = choice["logprobs"]["content"]
    check_entries(choice["message"]["content"], entries)
    partial = [e for e in entries if not is_utf8(bytes(e["bytes"]))]     # part of a character each
    assert partial and all("\\x" in e["token"] for e in partial), entries


def test_forced_tool_call_has_no_content_logprobs(batch):
    choice = batch["lp/tool"]["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None, choice
    assert choice["logprobs"]["content"] == []


def test_completions_logprobs_tokens_and_offsets(batch):
    choice = batch["lp/cmpl"]["choices"][0]
    lp = choice["logprobs"]
    assert "".join(lp["tokens"]) == choice["text"]
    assert lp["text_offset"] == [len("".join(lp["tokens"][:i])) for i in range(len(lp["tokens"]))]
    assert all(math.isfinite(v) for v in lp["token_logprobs"])
    assert all(0 < len(top) <= 2 and all(math.isfinite(v) for v in top.values()) for top in lp["top_logprobs"])
    chunks = [c for chunk in batch["lp/cmpl_stream"] for c in chunk["choices"] if c["logprobs"]]
    assert [t for c in chunks for t in c["logprobs"]["tokens"]] == lp["tokens"]
    assert [o for c in chunks for o in c["logprobs"]["text_offset"]] == lp["text_offset"]


def test_responses_output_text_logprobs(batch):
    part = batch["lp/resp"]["output"][0]["content"][0]
    check_entries(part["text"], part["logprobs"])
    events = batch["lp/resp_stream"]
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    assert "".join(e["delta"] for e in deltas) == part["text"]
    assert [lp["token"] for e in deltas for lp in e["logprobs"]] == [lp["token"] for lp in part["logprobs"]]
    [done] = [e for e in events if e["type"] == "response.output_text.done"]
    assert [lp["token"] for lp in done["logprobs"]] == [lp["token"] for lp in part["logprobs"]]


@pytest.mark.parametrize("name", ["lp/salt_chat", "lp/salt_cmpl", "lp/salt_resp"])
def test_cache_salt_shares_blocks_only_within_a_salt(batch, name):
    """A salted request shares no block with another salt nor with unsalted requests, not even the
    chat template's system prompt before the fresh marker, which the first unsalted request does
    find cached (from the other tests' requests); the same salt, or none again, finds the prompt."""
    cached = batch[name]
    assert cached["a"] == cached["b"] == 0, cached
    assert cached["none"] < 64 and (cached["none"] == 0 if name == "lp/salt_cmpl" else True), cached
    assert cached["a_again"] >= 64 and cached["none_again"] == cached["a_again"], cached
