"""Acceptance case 033 (../shared/cases): stop strings are matched on the detokenized text across
token and chunk boundaries; text held back while a stop string might still complete is flushed
when none does, and nothing from a match on is ever sent. On /v1/completions, /v1/chat/completions
and (neighbour) /v1/responses, whole and streamed (streams read by the official `openai` client);
end to end on the real server.

Each endpoint's job first asks for the greedy reference T with its tokens, then picks from them
S1 (starts inside one token, ends inside a later one) and S2 (T's last 3 characters and text the
model never writes) and sends the stop requests. The jobs go to the server in the session
fixture `batch` (tests/e2e/conftest.py) with those of the other case files.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.e2e.cases_support import (
    Jobs,
    case_steps,
    chat_url,
    completions_url,
    parallel,
    post,
    responses_url,
    sdk_stream,
    straddling_stop,
)

pytestmark = pytest.mark.slow

NEVER = "zz-never-zz"


def _completions_stream(client, body: dict[str, Any]) -> tuple[str, list[str]]:
    """(concatenated text, non-null finish reasons) of a streamed completion, via the SDK."""
    text, finishes = "", []
    for chunk in client.completions.create(**body, stream=True):
        for choice in chunk.choices:
            text += choice.text or ""
            if choice.finish_reason is not None:
                finishes.append(choice.finish_reason)
    return text, finishes


def _responses_stream(client, body: dict[str, Any]) -> tuple[str, list[str]]:
    """(concatenated output_text deltas, [terminal event type]) of a streamed response, via the SDK."""
    events = list(client.responses.create(**body, stream=True))
    return "".join(e.delta for e in events if e.type == "response.output_text.delta"), [events[-1].type]


def _variants(reference: str, stop1: str) -> dict[str, list[str]]:
    return {"s1": [stop1], "s2": [reference[-3:] + NEVER], "s1_list": [stop1, NEVER]}


def _completions_job(server) -> dict[str, Any]:
    client = server.client()
    body = {**case_steps("033")[0]["body"]}
    ref = post(completions_url(server), body).json()["choices"][0]
    tokens = ref["logprobs"]["tokens"]
    assert "".join(tokens) == ref["text"], (tokens, ref["text"])
    plain = {k: v for k, v in body.items() if k != "logprobs"}
    stop1 = straddling_stop(tokens)
    variants = _variants(ref["text"], stop1)
    variants["s1_included"] = [stop1]
    jobs = []
    for name, stop in variants.items():
        extra = {"include_stop_str_in_output": True} if name == "s1_included" else {}
        jobs.append(lambda s=stop, e=extra: post(completions_url(server), {**plain, **e, "stop": s}).json())
        jobs.append(lambda s=stop, e=extra: _completions_stream(client, {**plain, "stop": s, "extra_body": e}))
    answers = iter(parallel(*jobs))
    results = {name: (next(answers)["choices"][0], next(answers)) for name in variants}
    return {"reference": ref, "stop1": stop1,
            "results": {name: ((w["text"], w["finish_reason"]), s) for name, (w, s) in results.items()}}


def _chat_job(server) -> dict[str, Any]:
    client = server.client()
    body = {**case_steps("033")[3]["body"]}
    ref = post(chat_url(server), {**body, "logprobs": True}).json()["choices"][0]
    tokens = [t["token"] for t in ref["logprobs"]["content"]]
    text = ref["message"]["content"]
    assert "".join(tokens) == text, (tokens, text)     # the end-of-turn token has no logprob entry
    stop1 = straddling_stop(tokens)
    variants = _variants(text, stop1)
    jobs = []
    for stop in variants.values():
        jobs.append(lambda s=stop: post(chat_url(server), {**body, "stop": s}).json()["choices"][0])
        jobs.append(lambda s=stop: sdk_stream(client, **body, stop=s))
    answers = iter(parallel(*jobs))
    results = {}
    for name in variants:
        whole, stream = next(answers), next(answers)
        results[name] = ((whole["message"]["content"], whole["finish_reason"]),
                         (stream["content"][0], stream["finish"][0]))
    return {"reference": {"text": text, "finish_reason": ref["finish_reason"]}, "stop1": stop1, "results": results}


def _responses_job(server) -> dict[str, Any]:
    """The chat reference's prompt on /v1/responses with stop [S1] and [S2], whole and streamed
    (Responses reports no tokens: S1 is 7 characters from a third into the text)."""
    client = server.client()
    body = {"model": "default", "input": case_steps("033")[3]["body"]["messages"][0]["content"],
            "temperature": 0, "max_output_tokens": 24}
    ref = post(responses_url(server), body).json()
    text = ref["output"][0]["content"][0]["text"]
    stop1 = text[len(text) // 3: len(text) // 3 + 7]
    results = {}
    for name, stop in {"s1": [stop1], "s2": [text[-3:] + NEVER]}.items():
        whole = post(responses_url(server), {**body, "stop": stop}).json()
        streamed = _responses_stream(client, {**body, "extra_body": {"stop": stop}})
        results[name] = ("".join(p["text"] for item in whole["output"] for p in item.get("content") or []),
                         streamed[0])
    return {"text": text, "stop1": stop1, "results": results}


def _unicode_job(server, prompt: str) -> dict[str, Any]:
    """A prompt whose greedy continuation is non-ASCII (characters of several byte tokens): the
    reference T, then stop [S] (two characters a third into T) and [T[-3:] + NEVER], whole and
    streamed."""
    client = server.client()
    body = {"model": "default", "prompt": prompt, "temperature": 0, "max_tokens": 16}
    text = post(completions_url(server), body).json()["choices"][0]["text"]
    stop1 = text[len(text) // 3: len(text) // 3 + 2]
    results = {}
    for name, stop in {"s1": [stop1], "s2": [text[-3:] + NEVER]}.items():
        whole = post(completions_url(server), {**body, "stop": stop}).json()["choices"][0]
        results[name] = ((whole["text"], whole["finish_reason"]), _completions_stream(client, {**body, "stop": stop}))
    return {"text": text, "stop1": stop1, "results": results}


# started first in the shared batch (several requests in a row each): cases_support.collected_batch_jobs
LONG_JOBS = ("033n/japanese", "033n/chinese")


def batch_jobs(server) -> Jobs:
    """This file's requests for the shared `batch`."""
    return {"033/completions": lambda: _completions_job(server), "033/chat": lambda: _chat_job(server),
            "033n/responses": lambda: _responses_job(server),
            "033n/japanese": lambda: _unicode_job(server, "日本の首都は"),
            "033n/chinese": lambda: _unicode_job(server, "中文：你好，今天")}


def check_case(result: dict[str, Any], text_key: str) -> None:
    """The case's statements on one endpoint's results: S1 cuts before its start with finish stop,
    S2 withholds nothing (the reference's text and finish reason), [S1, NEVER] is [S1]; streamed
    chunks concatenate to the whole text."""
    reference, stop1 = result["reference"], result["stop1"]
    text = reference[text_key]
    cut = text[: text.index(stop1)]
    expected = {"s1": (cut, "stop"), "s2": (text, reference["finish_reason"]), "s1_list": (cut, "stop")}
    for name, (whole_text, whole_finish) in expected.items():
        (got_text, got_finish), (stream_text, stream_finish) = result["results"][name]
        assert (got_text, got_finish) == (whole_text, whole_finish), (name, stop1, got_text, got_finish)
        assert stream_text == whole_text, (name, stop1, stream_text)
        assert stream_finish == [whole_finish], (name, stream_finish)


def test_case033_completions_stop_across_tokens(batch):
    result = batch["033/completions"]
    assert result["reference"]["finish_reason"] == "length", result["reference"]
    check_case(result, "text")
    text, stop1 = result["reference"]["text"], result["stop1"]
    included = text[: text.index(stop1) + len(stop1)]
    assert result["results"]["s1_included"] == ((included, "stop"), (included, ["stop"]))


def test_case033_chat_stop_across_tokens(batch):
    check_case(batch["033/chat"], "text")


def test_case033_neighbours_responses_stop(batch):
    """/v1/responses with the same stops: S1 cuts the text before its start, S2 keeps it all,
    whole and streamed."""
    result = batch["033n/responses"]
    text, stop1 = result["text"], result["stop1"]
    assert result["results"]["s1"] == (text[: text.index(stop1)],) * 2, result
    assert result["results"]["s2"] == (text, text), result


@pytest.mark.parametrize("name", ["033n/japanese", "033n/chinese"])
def test_case033_neighbours_multibyte_text(batch, name):
    """Stops inside text made of multi-byte characters: S cuts before its start (finish stop) and
    the stream never sends a partial character (U+FFFD) before it; T[-3:] + NEVER keeps all of T,
    as the unstopped request returned it."""
    result = batch[name]
    text, stop1 = result["text"], result["stop1"]
    cut = text[: text.index(stop1)]
    (whole, finish), (streamed, finishes) = result["results"]["s1"]
    assert (whole, finish) == (cut, "stop") and (streamed, finishes) == (cut, ["stop"]), (text, stop1, result)
    assert "\ufffd" not in streamed, streamed
    (whole, finish), (streamed, finishes) = result["results"]["s2"]
    assert whole == streamed == text and finishes == [finish], (text, result)
