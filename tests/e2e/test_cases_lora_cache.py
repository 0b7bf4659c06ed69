"""Acceptance case 017 (../shared/cases): the prefix cache never serves KV computed under one LoRA
adapter, or under an earlier load of an adapter name, to another; end to end on real servers.

Two servers with the same adapters (`cases_lora.py`; one torch thread each, so both compute
bit-identical greedy outputs):
- `cached` (prefix caching on, --max-loras 1: every adapter switch also reuses the one slot, so a
  cache keyed by slot or by name would mix adapters) runs the case's steps, one request at a time;
- `cold` (--no-enable-prefix-caching, every adapter resident) answers every (model, prompt) cold:
  what a freshly started server answers. It stands in for the case's restarts (step 1's B0, and
  the cold runs of steps 4 and 5).
`test_case017_...` runs the case's steps; `test_case017_neighbours_...` the rest of its kind: other
endpoints (completions whole and streamed, Responses), a name unloaded and loaded again or
reloaded in place with other weights, and two adapters asking the same prompt at once.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pytest

from tests.e2e.cases_lora import MAX_LORA_RANK, start_servers
from tests.e2e.cases_support import HTTP, case_steps, parallel, post, post_sse
from tests.e2e.conftest import MODEL, Server, stop_server

pytestmark = pytest.mark.slow

CHAT, CMPL, RESP = "/v1/chat/completions", "/v1/completions", "/v1/responses"
# the case's "shared system prompt of about 600 tokens" (checked through /tokenize)
SYSTEM = " ".join(f"Rule {i}: in this story the traveller number {i} carries a lantern and a map of the valley."
                  for i in range(24))
PROMPT_2 = "Chapter one. " + " ".join(f"The river {i} runs north past the mill and the old stone bridge."
                                      for i in range(10)) + "\nThe next morning"
SYSTEM_3 = " ".join(f"Note {i}: the shop on corner {i} sells bread, candles and rope." for i in range(8))
SYSTEM_4 = " ".join(f"Entry {i}: the ship {i} left the harbour at dawn carrying salt." for i in range(8))
SYSTEM_5 = " ".join(f"Fact {i}: the tower {i} has {i + 3} windows facing the sea." for i in range(8))


@dataclass(frozen=True)
class Answer:
    text: str
    cached: int     # usage.prompt_tokens_details.cached_tokens (Responses: input_tokens_details)
    model: str


def chat_body(model: str, system: str, user: str, max_tokens: int = 16) -> dict[str, Any]:
    return {"model": model, "temperature": 0, "max_tokens": max_tokens,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}]}


def completion_body(model: str, prompt: str) -> dict[str, Any]:
    return {"model": model, "temperature": 0, "max_tokens": 16, "prompt": prompt}


def ask(srv: Server, path: str, body: dict[str, Any]) -> Answer:
    """One whole request: status 200, the answer text, cached prompt tokens and `model`."""
    r = post(srv.url + path, body)
    assert r.status_code == 200, (path, body["model"], r.text[:300])
    data = r.json()
    if path == RESP:
        text = "".join(part["text"] for item in data["output"] if item["type"] == "message"
                       for part in item["content"])
        return Answer(text, data["usage"]["input_tokens_details"]["cached_tokens"], data["model"])
    choice = data["choices"][0]
    text = choice["message"]["content"] if path == CHAT else choice["text"]
    return Answer(text, data["usage"]["prompt_tokens_details"]["cached_tokens"], data["model"])


def ask_stream(srv: Server, body: dict[str, Any]) -> Answer:
    """A streamed completion with usage: the joined text, and the usage chunk's cached tokens."""
    sse = post_sse(srv.url + CMPL, {**body, "stream": True, "stream_options": {"include_usage": True}})
    assert sse.status == 200 and not sse.problems, (sse.text[:300], sse.problems)
    text = "".join(c["text"] for chunk in sse.chunks for c in chunk["choices"])
    usage = sse.chunks[-1]["usage"]
    return Answer(text, usage["prompt_tokens_details"]["cached_tokens"], sse.chunks[0]["model"])


def load(srv: Server, name: str, path: Any, inplace: bool = False) -> None:
    r = post(srv.url + "/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(path), "load_inplace": inplace})
    assert r.status_code == 200, r.text


def unload(srv: Server, name: str) -> None:
    r = post(srv.url + "/v1/unload_lora_adapter", {"lora_name": name})
    assert r.status_code == 200, r.text


@dataclass
class Servers:
    cached: Server
    cold: Server


@pytest.fixture(scope="module")
def servers(case_adapters, tmp_path_factory) -> Iterator[Servers]:
    a, b, c = (case_adapters[name] for name in ("adapter-a", "adapter-b", "adapter-c"))
    # float32 weights: the cached server's batched answers are compared with the cold server's solo ones
    common = ("--enable-lora", "--max-lora-rank", str(MAX_LORA_RANK), "--num-threads", "1", "--quantization", "none")
    cached, cold = start_servers(
        tmp_path_factory.mktemp("case017"),
        [*common, "--lora-modules", f"adapter-a={a}", f"adapter-b={b}", "--max-loras", "1", "--allow-runtime-lora"],
        [*common, "--lora-modules", f"adapter-a={a}", f"adapter-b={b}", f"adapter-c={c}", "--max-loras", "3",
         "--no-enable-prefix-caching"])
    yield Servers(cached, cold)
    stop_server(cached, cold)


def _case_bodies() -> list[dict[str, Any]]:
    """The case's five step bodies with the shared system prompt filled in, and the served model's
    name for the case's "default" (a response names the model it was asked for)."""
    bodies = [step["body"] for step in case_steps("017")]
    for body in bodies:
        assert body["messages"][0]["role"] == "system"
        body["messages"][0]["content"] = SYSTEM
        body["model"] = MODEL if body["model"] == "default" else body["model"]
    return bodies


class ColdAnswers(Mapping[str, Answer]):
    """Cold answers computed one at a time on a background thread, in the order of the tests that
    read them; a lookup waits for its own answer only (and raises what failed for it), so that the
    first test starts once its four answers are in while the `cold` server computes the rest on
    its own core (waiting for all 13 first cost the module about 25 s on the 2-core box)."""

    def __init__(self, srv: Server, jobs: dict[str, tuple[str, dict[str, Any]]],
                 checks: dict[tuple[str, ...], Callable[[list[Answer]], None]]) -> None:
        self._futures: dict[str, concurrent.futures.Future[Answer]] = {
            key: concurrent.futures.Future() for key in jobs}
        self._thread = threading.Thread(target=self._run, args=(srv, jobs, checks), daemon=True,
                                        name="case017-cold")
        self._thread.start()

    def _run(self, srv: Server, jobs: dict[str, tuple[str, dict[str, Any]]],
             checks: dict[tuple[str, ...], Callable[[list[Answer]], None]]) -> None:
        """Ask each job in order. An answer is released once it is in and every `checks` group
        holding its key is complete and passed its check; the first failure (a request, a cached
        token, a check) fails every answer not yet released, as the whole fixture failed before."""
        answers: dict[str, Answer] = {}
        try:
            for key, job in jobs.items():
                answers[key] = ask(srv, *job)
                assert answers[key].cached == 0, f"the cold server served cached tokens for {key}"
                for group, check in checks.items():
                    if key in group and all(k in answers for k in group):
                        check([answers[k] for k in group])
                for k, answer in answers.items():
                    pending = any(k in group and not all(g in answers for g in group) for group in checks)
                    if not pending and not self._futures[k].done():
                        self._futures[k].set_result(answer)
        except BaseException as exc:  # noqa: BLE001 - re-raised by every lookup still waiting
            for future in self._futures.values():
                if not future.done():
                    future.set_exception(exc)

    def join(self, timeout_s: float) -> None:
        self._thread.join(timeout_s)

    def __getitem__(self, key: str) -> Answer:
        return self._futures[key].result()

    def __iter__(self) -> Iterator[str]:
        return iter(self._futures)

    def __len__(self) -> int:
        return len(self._futures)


@pytest.fixture(scope="module")
def cold(servers) -> Iterator[Mapping[str, Answer]]:
    """Cold answers (the `cold` server, one request at a time, as the tested server gets them: a
    batch of other size may round differently and flip a late greedy token), by
    "<prompt>/<adapter weights>". The `cold` server computes them on its own core while the tests
    send their requests to `cached`; a lookup waits for its answer (`ColdAnswers`)."""
    answers = ColdAnswers(servers.cold, _cold_jobs(), {_P1: _check_adapters_differ})
    yield answers
    answers.join(600.0)    # before the servers stop


_P1 = tuple(f"p1/{model}" for model in ("adapter-a", "adapter-b", MODEL, "adapter-c"))


def _check_adapters_differ(answers: list[Answer]) -> None:
    assert len({answer.text for answer in answers}) == len(answers), \
        "the adapters do not change the output, so the test could not see a mix-up"


def _cold_jobs() -> dict[str, tuple[str, dict[str, Any]]]:
    """The cold requests by key, in the order the tests read them."""
    jobs: dict[str, tuple[str, dict[str, Any]]] = {}
    case = _case_bodies()
    for key in _P1:
        jobs[key] = (CHAT, {**case[1], "model": key.split("/", 1)[1]})
    for model in ("adapter-b", MODEL):
        jobs[f"p2/{model}"] = (CMPL, completion_body(model, PROMPT_2))
        jobs[f"p3/{model}"] = (CHAT, chat_body(model, SYSTEM_3, "Which shop sells rope?"))
    for model in ("adapter-a", "adapter-b", "adapter-c"):
        jobs[f"p4/{model}"] = (CHAT, chat_body(model, SYSTEM_4, "Where did the ships go?"))
    for model in ("adapter-b", MODEL):
        jobs[f"p5/{model}"] = (CHAT, chat_body(model, SYSTEM_5, "How many windows?"))
    return jobs


def test_case017_adapter_switch_never_reuses_other_adapters_kv(servers, cold, case_adapters):
    srv = servers.cached
    bodies = _case_bodies()
    assert [b["model"] for b in bodies] == ["adapter-b", "adapter-a", "adapter-b", MODEL, "adapter-a"]
    count = HTTP.post(srv.url + "/tokenize", json={"model": MODEL, "messages": bodies[0]["messages"]}).json()
    assert 500 <= count["count"] <= 700, count
    step2 = ask(srv, CHAT, bodies[1])      # the first request of this server: adapter-a's KV is cached
    step3 = ask(srv, CHAT, bodies[2])
    step3_again = ask(srv, CHAT, bodies[2])
    step4 = ask(srv, CHAT, bodies[3])
    load(srv, "adapter-a", case_adapters["adapter-c"], inplace=True)
    step5 = ask(srv, CHAT, bodies[4])
    assert step2 == Answer(cold["p1/adapter-a"].text, 0, "adapter-a")
    assert step3 == Answer(cold["p1/adapter-b"].text, 0, "adapter-b"), "adapter-b was served adapter-a's KV"
    assert step3_again.text == step3.text and step3_again.cached > 0, "no cache hit within one adapter"
    assert step4 == Answer(cold[f"p1/{MODEL}"].text, 0, MODEL), "the base model was served adapter KV"
    assert step5 == Answer(cold["p1/adapter-c"].text, 0, "adapter-a"), "the reloaded name kept the old KV"


def test_case017_neighbours_completions_and_responses_share_cache_only_within_an_adapter(servers, cold):
    """/v1/completions (streamed and whole) and /v1/responses key the cache by adapter too; a chat
    request hits the blocks a Responses request of the same adapter and prompt left behind."""
    srv = servers.cached
    streamed = ask_stream(srv, completion_body("adapter-b", PROMPT_2))
    base = ask(srv, CMPL, completion_body(MODEL, PROMPT_2))
    whole = ask(srv, CMPL, completion_body("adapter-b", PROMPT_2))
    assert streamed == Answer(cold["p2/adapter-b"].text, 0, "adapter-b")
    assert base == Answer(cold[f"p2/{MODEL}"].text, 0, MODEL)
    assert whole.text == streamed.text and whole.cached > 0
    responses = {"instructions": SYSTEM_3, "input": "Which shop sells rope?", "temperature": 0,
                 "max_output_tokens": 16}
    r_base = ask(srv, RESP, {**responses, "model": MODEL})
    r_adapter = ask(srv, RESP, {**responses, "model": "adapter-b"})
    chat = ask(srv, CHAT, chat_body("adapter-b", SYSTEM_3, "Which shop sells rope?"))
    assert r_base == Answer(cold[f"p3/{MODEL}"].text, 0, MODEL)
    assert r_adapter == Answer(cold["p3/adapter-b"].text, 0, "adapter-b")
    assert chat.text == r_adapter.text and chat.cached > 0


def test_case017_neighbours_reused_name_never_serves_old_weights_kv(servers, cold, case_adapters):
    """A name unloaded and loaded again with other weights, then reloaded in place with a third
    set: each load answers like a cold run of its own weights, with no cached tokens."""
    srv = servers.cached
    body = chat_body("adapter-x", SYSTEM_4, "Where did the ships go?")
    load(srv, "adapter-x", case_adapters["adapter-b"])
    first = ask(srv, CHAT, body)
    again = ask(srv, CHAT, body)
    unload(srv, "adapter-x")
    load(srv, "adapter-x", case_adapters["adapter-c"])
    second = ask(srv, CHAT, body)
    load(srv, "adapter-x", case_adapters["adapter-a"], inplace=True)
    third = ask(srv, CHAT, body)
    unload(srv, "adapter-x")
    assert first == Answer(cold["p4/adapter-b"].text, 0, "adapter-x")
    assert again.text == first.text and again.cached > 0
    assert second == Answer(cold["p4/adapter-c"].text, 0, "adapter-x"), "unload + load kept the old KV"
    assert third == Answer(cold["p4/adapter-a"].text, 0, "adapter-x"), "an in-place reload kept the old KV"


def test_case017_neighbours_two_adapters_same_prompt_at_once(servers, cold):
    """The base model and an adapter asking the same new prompt concurrently (both prefills in
    flight together) each answer like a cold run; a repeat then hits its own adapter's blocks."""
    srv = servers.cached
    models = [MODEL, "adapter-b", MODEL, "adapter-b"]
    answers = parallel(*[lambda m=m: ask(srv, CHAT, chat_body(m, SYSTEM_5, "How many windows?")) for m in models])
    for model, answer in zip(models, answers, strict=True):
        assert (answer.text, answer.model) == (cold[f"p5/{model}"].text, model), (model, answer)
    for model in ("adapter-b", MODEL):
        again = ask(srv, CHAT, chat_body(model, SYSTEM_5, "How many windows?"))
        assert again.text == cold[f"p5/{model}"].text and again.cached > 0, (model, again)
