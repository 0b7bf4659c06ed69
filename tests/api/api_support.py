"""Test support for tests/api: a byte-level fake tokenizer, a deterministic fake engine with
AsyncEngine's interface, and SSE parsing helpers. (Named uniquely: tests/ has no __init__.py.)"""

from __future__ import annotations

import asyncio
import codecs
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest

from engine.errors import EngineDeadError, EngineOverloaded
from engine.model_limits import ModelLimits
from engine.request import CompletionDelta, EngineRequest, RequestOutput, TokenLogprob
from engine.stats import EngineStats
from tests.byte_tokenizer import ByteTokenizer

SPECIAL_TOKENS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] "
    "+ '<|im_end|>\n' }}{% endfor %}"
    "{% if tools %}{{ '<|im_start|>tools\n' + (tools | tojson) + '<|im_end|>\n' }}{% endif %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


class FakeTokenizer(ByteTokenizer):
    """The api tests' tokenizer (`tests/byte_tokenizer.py`): UTF-8 bytes, then SmolLM2's three
    special tokens as 256.., and CHAT_TEMPLATE."""

    def __init__(self) -> None:
        super().__init__(SPECIAL_TOKENS, chat_template=CHAT_TEMPLATE)


class FakeEngine:
    """Emits `script` (choice i > 0: `script` + " #i") one byte-token per step, cut at stop strings
    and stop_token_ids (the stop token is generated, its text withheld, as the engine does).

    `script_for(request, index)`, when set, gives each choice's full text instead (e.g. a scripted
    tool call). A multi-byte character's text is released with its last byte. `grammar_error`, when
    set, is raised before the first output of every request that carries a grammar (a failed compile).

    Records submitted requests, abort() calls and requests whose generator was closed unfinished
    (`aborted`), like AsyncEngine, which aborts a request whose consumer stops iterating.
    Like AsyncEngine, refuses new requests when not `healthy` (EngineDeadError) or `overloaded`
    (EngineOverloaded), and checks each against its vocabulary and `max_model_len` with the
    engine's own `ModelLimits.validate` (what LLMEngine.validate runs), all when `generate` is
    called; `abort_all()` ends every running request with finish_reason "abort".
    """

    def __init__(
        self,
        script: str = "Hello world!",
        step_delay_s: float = 0.0,
        first_token_delay_s: float = 0.0,
        max_model_len: int = 256,
    ) -> None:
        self.tokenizer = FakeTokenizer()
        self.model_name = "fake-model"
        self.model_path = "/models/fake.gguf"
        self.max_model_len = max_model_len
        self.vocab_size = self.tokenizer.vocab_size
        self.script = script
        self.step_delay_s = step_delay_s
        self.first_token_delay_s = first_token_delay_s
        self.healthy = True
        self.overloaded = False
        self.abort_all_calls = 0
        self._live: set[str] = set()
        self._aborting: set[str] = set()
        self.fail_after_tokens: int | None = None  # raise `failure` mid-stream after this many steps
        self.failure: Exception = RuntimeError("fake engine failure")
        self.script_for: Callable[[EngineRequest, int], str] | None = None
        self.grammar_error: Exception | None = None
        self.requests: list[EngineRequest] = []
        self.aborted: list[str] = []
        self.abort_calls: list[str] = []
        self.completed: list[str] = []

    @property
    def limits(self) -> ModelLimits:
        """The engine's request checks over this fake's (settable) vocab_size and max_model_len."""
        return ModelLimits(self.vocab_size, self.max_model_len)

    def choice_text(self, index: int, request: EngineRequest | None = None) -> str:
        """The full text choice `index` would produce without stop strings or max_tokens."""
        if self.script_for is not None and request is not None:
            return self.script_for(request, index)
        return self.script if index == 0 else f"{self.script} #{index}"

    def generate(self, request: EngineRequest) -> AsyncIterator[RequestOutput]:
        """Like AsyncEngine.generate: admission and the engine's checks now, the outputs when iterated."""
        self.check_admission()
        self.limits.validate(request)
        return self._outputs(request)

    def check_token_ids(self, token_ids: list[int], param: str) -> None:
        """The engine's vocabulary check (AsyncEngine.check_token_ids)."""
        self.limits.check_token_ids(token_ids, param)

    async def _outputs(self, request: EngineRequest) -> AsyncIterator[RequestOutput]:
        params = request.sampling_params
        num_prompt = len(request.prompt_token_ids)
        self.requests.append(request)
        if self.grammar_error is not None and request.grammar_spec is not None:
            raise self.grammar_error
        plans = [self._plan(request, i) for i in range(params.n)]
        num_steps = max(len(ids) for ids, _, _, _ in plans)
        done = False
        self._live.add(request.request_id)
        try:
            await asyncio.sleep(self.first_token_delay_s)
            num_output = 0
            for step in range(num_steps):
                if self.fail_after_tokens is not None and step >= self.fail_after_tokens:
                    raise self.failure
                if step:
                    await asyncio.sleep(self.step_delay_s)
                if request.request_id in self._aborting:
                    done = True
                    aborts = [CompletionDelta(i, [], "", finish_reason="abort") for i in range(params.n)]
                    yield RequestOutput(request.request_id, aborts, num_prompt, 2, num_output, finished=True)
                    return
                deltas = []
                for i, (ids, texts, reason, stop_reason) in enumerate(plans):
                    if step >= len(ids):
                        continue
                    num_output += 1
                    last = step == len(ids) - 1
                    logprobs = None
                    if params.logprobs is not None:
                        top = [(ids[step], -0.25), (ord("x"), float("-inf"))][: params.logprobs]
                        logprobs = [TokenLogprob(ids[step], -0.25, top)]
                    deltas.append(
                        CompletionDelta(i, [ids[step]], texts[step], logprobs, reason if last else None,
                                        stop_reason if last else None)
                    )
                finished = step == num_steps - 1
                yield RequestOutput(
                    request.request_id,
                    deltas,
                    num_prompt,
                    num_cached_tokens=2,
                    num_output_tokens=num_output,
                    finished=finished,
                )
            done = True
            self.completed.append(request.request_id)
        finally:
            self._live.discard(request.request_id)
            if not done:
                self.aborted.append(request.request_id)

    def _plan(self, request: EngineRequest, index: int) -> tuple[list[int], list[str], str, str | int | None]:
        """(token ids, text released per token, finish reason, the stop string or stop token id that
        ended it) of one choice."""
        stops, max_tokens = request.sampling_params.stop, self.limits.max_tokens(request)
        text = self.choice_text(index, request)
        cuts = sorted((text.index(s), s) for s in stops if s in text)
        stop_reason = cuts[0][1] if cuts else None
        if cuts:
            text = text[: cuts[0][0]]
        ids = self.tokenizer.encode(text)
        if not ids:  # a stop string at the very start: one token is generated, its text withheld
            return [ord(" ")], [""], "stop", stop_reason
        stop_at = next((i for i, t in enumerate(ids) if t in request.sampling_params.stop_token_ids), None)
        if stop_at is not None and stop_at < max_tokens:
            texts = _released_texts(self.tokenizer, ids[:stop_at]) + [""]
            return ids[: stop_at + 1], texts, "stop", ids[stop_at]
        reason = "stop"
        if len(ids) > max_tokens:
            ids, reason, stop_reason = ids[:max_tokens], "length", None
        return ids, _released_texts(self.tokenizer, ids), reason, stop_reason

    def abort(self, request_id: str) -> None:
        self.abort_calls.append(request_id)

    def abort_all(self) -> None:
        self.abort_all_calls += 1
        self._aborting |= self._live

    def check_admission(self) -> None:
        if not self.healthy:
            raise EngineDeadError("the engine is not running")
        if self.overloaded:
            raise EngineOverloaded("the server is overloaded: 1 requests are waiting (limit 1); retry later")

    def is_healthy(self) -> bool:
        return self.healthy

    def stats(self) -> EngineStats:
        return EngineStats(num_requests_running=len(self.requests) - len(self.abort_calls), num_requests_waiting=0,
                           kv_cache_usage=0.25, num_blocks=100, num_free_blocks=75, prefix_cache_queries=64,
                           prefix_cache_hits=32, prompt_tokens=len(self.requests) * 10, generation_tokens=7,
                           num_preemptions=0)


def _released_texts(tokenizer: FakeTokenizer, ids: list[int]) -> list[str]:
    """Text released per token: UTF-8 bytes of an unfinished character wait for its last byte."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    texts = []
    for i, t in enumerate(ids):
        if t < 256:
            texts.append(decoder.decode(bytes([t]), final=i == len(ids) - 1))
        else:
            texts.append(decoder.decode(b"", final=True) + tokenizer.decode([t]))
    return texts


def chat_body(**fields: Any) -> dict[str, Any]:
    """A minimal valid chat request with `fields` added."""
    return {"model": "fake-model", "messages": [{"role": "user", "content": "Say hello."}], **fields}


def sse_events(text: str) -> list[str]:
    """The data payloads of an SSE body, checking the framing: every event is one `data: ` line
    followed by a blank line (comment lines allowed)."""
    assert text.endswith("\n\n"), repr(text[-20:])
    payloads = []
    for block in text.split("\n\n")[:-1]:
        lines = [line for line in block.split("\n") if not line.startswith(":")]
        assert len(lines) == 1 and lines[0].startswith("data: "), block
        payloads.append(lines[0][len("data: ") :])
    return payloads


def sse_json(text: str) -> list[dict[str, Any]]:
    """The JSON events of an SSE body that ends with `data: [DONE]` (asserted)."""
    payloads = sse_events(text)
    assert payloads[-1] == "[DONE]"
    assert "[DONE]" not in payloads[:-1]
    return [json.loads(p) for p in payloads[:-1]]


@asynccontextmanager
async def sdk_client(app: Any) -> AsyncIterator[Any]:
    """The official `openai.AsyncOpenAI` client talking to `app` over ASGI, without retries."""
    import openai

    http_client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")
    async with openai.AsyncOpenAI(
        base_url="http://test/v1", api_key="x", http_client=http_client, max_retries=0
    ) as client:
        yield client


def anthropic_client(app: Any, api_key: str = "x") -> Any:
    """The official `anthropic.AsyncAnthropic` client talking to `app` over ASGI, without retries
    (the SDK's HTTP package is httpx2, httpx's successor)."""
    import anthropic
    import httpx2

    http_client = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://test")
    return anthropic.AsyncAnthropic(base_url="http://test", api_key=api_key, http_client=http_client,
                                    max_retries=0)


async def messages_whole_and_streamed(app: Any, body: dict[str, Any]) -> tuple[str, list[Any], Any, Any]:
    """(text, [(tool name, input)], stop_reason, stop_sequence) of a /v1/messages `body`, read by
    the anthropic SDK whole and streamed (its final message), asserted equal.

    One difference only is accepted: a forced call that max_tokens cut is left out of the message,
    but its tool_use block had started in the stream (a delta cannot be taken back), so the SDK's
    assembly keeps it; then the stream's final message has exactly one more, trailing, tool_use
    whose streamed input_json is not JSON, and stop_reason is "max_tokens"."""
    async with anthropic_client(app) as client:
        whole = await client.messages.create(**body)
        fragments: dict[int, str] = {}
        async with client.messages.stream(**body) as stream:
            async for event in stream:
                if event.type == "content_block_delta" and event.delta.type == "input_json_delta":
                    fragments[event.index] = fragments.get(event.index, "") + event.delta.partial_json
            final = await stream.get_final_message()
    streamed_blocks = list(final.content)
    forced = body.get("tool_choice", {}).get("type") in ("any", "tool")
    if forced and final.stop_reason == "max_tokens" and len(streamed_blocks) == len(whole.content) + 1:
        cut = streamed_blocks.pop()
        assert cut.type == "tool_use"
        with pytest.raises(json.JSONDecodeError):
            json.loads(fragments.get(len(streamed_blocks), ""))
    got = []
    for message, blocks in ((whole, list(whole.content)), (final, streamed_blocks)):
        text = "".join(b.text for b in blocks if b.type == "text")
        uses = [(b.name, b.input) for b in blocks if b.type == "tool_use"]
        got.append((text, uses, message.stop_reason, message.stop_sequence))
    assert got[0] == got[1]
    return got[0]
