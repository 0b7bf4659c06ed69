"""AsyncEngine on a tiny random Llama: admission (overload), request timeouts, abort_all, engine
death (no request is left waiting), and grammar compile crashes / timeouts failing only their request."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from constrained import CompiledGrammar, GrammarBackend, GrammarCompiler, GrammarConfig, GrammarKind, GrammarSpec
from constrained.errors import GrammarCompileTimeout
from engine.async_engine import AsyncEngine
from engine.errors import EngineDeadError, EngineOverloaded, EngineStepError, RequestTimedOut
from engine.request import EngineRequest, RequestOutput
from engine.request_deadlines import RequestDeadlines
from engine.sampling_params import SamplingParams
from tiny_engine import load_tiny, make_engine

FAST_S = 5.0   # "at once": well under any timeout a hanging request would hit


@pytest.fixture
def tiny(tiny_model_dir):
    return load_tiny(tiny_model_dir)


def start(tiny, step_delay_s: float = 0.0, max_consecutive_failures: int = 3, **overrides) -> AsyncEngine:
    """An AsyncEngine over the tiny model; each forward sleeps `step_delay_s` first (slow steps)."""
    engine = make_engine(tiny, **overrides)
    if step_delay_s:
        execute = engine.runner.execute

        def slow_execute(sched):
            time.sleep(step_delay_s)
            return execute(sched)

        engine.runner.execute = slow_execute
    return AsyncEngine(engine, "tiny", "tiny", max_consecutive_failures)


def request(request_id: str, max_tokens: int = 8, grammar_spec: GrammarSpec | None = None) -> EngineRequest:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    return EngineRequest(request_id, list(range(1, 21)), params, grammar_spec)


async def consume(engine: AsyncEngine, req: EngineRequest) -> list[RequestOutput]:
    return [out async for out in engine.generate(req)]


def all_blocks_free(engine: AsyncEngine) -> bool:
    pool = engine.engine.block_pool
    return pool.num_free_blocks == pool.num_blocks


async def wait_until(condition, timeout_s: float = FAST_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


def test_overload_refuses_before_queueing_and_recovers(tiny):
    engine = start(tiny, step_delay_s=0.02, max_num_seqs=1, max_waiting_requests=1)

    async def main():
        running = engine.generate(request("running", max_tokens=100))
        await running.__anext__()                       # first token out: it runs, the one slot is taken
        waiting = asyncio.ensure_future(consume(engine, request("waiting", max_tokens=4)))
        await wait_until(lambda: engine.num_waiting() == 1)
        submitted = engine._num_submitted
        started = time.monotonic()
        with pytest.raises(EngineOverloaded, match="1 requests are waiting"):
            await consume(engine, request("refused"))
        assert time.monotonic() - started < 0.5 and engine._num_submitted == submitted, "refused at once, unqueued"
        with pytest.raises(EngineOverloaded):
            engine.check_admission()
        await running.aclose()                          # aborts it: the waiting one runs and finishes
        assert (await waiting)[-1].finished
        engine.check_admission()
        assert (await consume(engine, request("after")))[-1].finished

    try:
        asyncio.run(main())
        assert all_blocks_free(engine) and engine.num_waiting() == 0
    finally:
        engine.shutdown()


def test_request_timeout_aborts_running_and_waiting_requests_and_frees_blocks(tiny):
    engine = start(tiny, step_delay_s=0.02, max_num_seqs=1, request_timeout_s=0.4)

    async def main():
        started = time.monotonic()
        results = await asyncio.gather(consume(engine, request("long", max_tokens=100)),
                                       consume(engine, request("queued", max_tokens=100)),
                                       return_exceptions=True)
        assert all(isinstance(r, RequestTimedOut) for r in results), results
        assert time.monotonic() - started < 0.4 + 1.5
        assert all_blocks_free(engine) and not engine.engine.requests
        assert (await consume(engine, request("short", max_tokens=3)))[-1].finished

    try:
        asyncio.run(main())
        assert engine.is_healthy()
    finally:
        engine.shutdown()


def test_abort_all_ends_every_request_with_abort(tiny):
    engine = start(tiny, step_delay_s=0.02, max_num_seqs=1)

    async def main():
        tasks = [asyncio.ensure_future(consume(engine, request(f"r{i}", max_tokens=100))) for i in range(2)]
        await wait_until(lambda: len(engine.engine.requests) == 2)
        engine.abort_all()
        for outputs in await asyncio.wait_for(asyncio.gather(*tasks), FAST_S):
            assert outputs[-1].finished and outputs[-1].deltas[-1].finish_reason == "abort"
        assert all_blocks_free(engine)
        assert (await consume(engine, request("after", max_tokens=3)))[-1].finished

    try:
        asyncio.run(main())
    finally:
        engine.shutdown()


def blocking_then(tiny, error: BaseException, max_consecutive_failures: int) -> tuple[AsyncEngine, threading.Event,
                                                                                     threading.Event]:
    """An engine whose first forward waits for `release`, then every forward raises `error`."""
    engine = start(tiny, max_consecutive_failures=max_consecutive_failures)
    entered, release = threading.Event(), threading.Event()

    def failing_execute(sched):
        entered.set()
        release.wait(FAST_S)
        raise error

    engine.engine.runner.execute = failing_execute
    return engine, entered, release


@pytest.mark.parametrize("error", [RuntimeError("injected step failure"), SystemExit("injected thread crash")],
                         ids=["failing-steps", "thread-crash"])
def test_dead_engine_fails_parked_and_new_requests_at_once(tiny, error):
    engine, entered, release = blocking_then(tiny, error, max_consecutive_failures=1)

    async def main():
        in_step = asyncio.ensure_future(consume(engine, request("in-step")))
        await asyncio.to_thread(entered.wait, FAST_S)
        parked = [asyncio.ensure_future(consume(engine, request(f"parked{i}"))) for i in range(3)]
        await wait_until(lambda: engine.num_waiting() == 3)     # all three sit in the inbox
        release.set()
        results = await asyncio.wait_for(asyncio.gather(in_step, *parked, return_exceptions=True), FAST_S)
        expected_first = EngineStepError if isinstance(error, Exception) else EngineDeadError
        assert isinstance(results[0], expected_first), results
        assert all(isinstance(r, EngineDeadError) for r in results[1:]), results
        assert not engine.is_healthy()
        started = time.monotonic()
        with pytest.raises(EngineDeadError):
            await consume(engine, request("new"))
        assert time.monotonic() - started < 0.5

    try:
        asyncio.run(main())
    finally:
        release.set()
        engine.shutdown()


def test_three_failing_steps_kill_the_engine(tiny):
    engine, entered, release = blocking_then(tiny, RuntimeError("injected"), max_consecutive_failures=3)
    release.set()

    async def main():
        for i in range(3):
            with pytest.raises(EngineStepError):
                await asyncio.wait_for(consume(engine, request(f"r{i}")), FAST_S)
        await wait_until(lambda: not engine.is_healthy())
        with pytest.raises(EngineDeadError):
            await consume(engine, request("new"))

    try:
        asyncio.run(main())
    finally:
        engine.shutdown()


class FaultyBackend(GrammarBackend):
    """Compiling "crash" raises RuntimeError (a backend bug); anything else takes 1.5 s (past the
    test's 0.3 s compile timeout; the late result only lands in the compile cache)."""

    def compile(self, spec: GrammarSpec) -> CompiledGrammar:
        if spec.source == "crash":
            raise RuntimeError("backend crashed")
        time.sleep(1.5)
        return CompiledGrammar("xgrammar", spec, object(), 1.5)

    def new_matcher(self, compiled):
        raise AssertionError("no grammar in this test compiles")

    def fill_bitmasks(self, matchers, bitmask) -> None:
        raise AssertionError("no grammar in this test compiles")


def test_grammar_compile_crash_and_timeout_fail_only_their_request(tiny):
    engine = start(tiny, step_delay_s=0.01)
    structured = engine.engine.structured
    structured.compiler = GrammarCompiler(structured.vocab_info, GrammarConfig(compile_timeout_s=0.3),
                                          backends={"xgrammar": FaultyBackend(structured.vocab_info)})

    def spec(source: str) -> GrammarSpec:
        return GrammarSpec(GrammarKind.REGEX, source, backend="xgrammar")

    async def main():
        crash, slow, plain = await asyncio.wait_for(asyncio.gather(
            consume(engine, request("crash", grammar_spec=spec("crash"))),
            consume(engine, request("slow", grammar_spec=spec("slow"))),
            consume(engine, request("plain", max_tokens=30)),
            return_exceptions=True), FAST_S)
        assert isinstance(crash, RuntimeError) and "backend crashed" in str(crash)
        assert isinstance(slow, GrammarCompileTimeout)
        assert plain[-1].finished and sum(len(d.token_ids) for o in plain for d in o.deltas) == 30
        assert all_blocks_free(engine)

    try:
        asyncio.run(main())
        assert engine.is_healthy()
    finally:
        engine.shutdown()


def test_request_deadlines_forget_finished_requests():
    deadlines = RequestDeadlines(timeout_s=1.0)
    deadlines.add("a", arrival_time=100.0)
    deadlines.add("b", arrival_time=100.5)
    deadlines.add("gone", arrival_time=99.0)
    assert deadlines.wait_s(0.5, now=100.0) == pytest.approx(0.01)      # "gone" is already due
    assert deadlines.expired({"a", "b"}, now=101.2) == ["a"]            # "gone" left the engine: forgotten
    assert deadlines.wait_s(0.5, now=101.2) == pytest.approx(0.3)
    assert deadlines.expired({"a", "b"}, now=101.2) == []
    assert RequestDeadlines(None).expired({"x"}) == [] and RequestDeadlines(None).wait_s(0.5) == 0.5
