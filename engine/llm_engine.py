"""LLMEngine: the synchronous step loop body (schedule, forward, sample, detokenize, stop)."""

from __future__ import annotations

import dataclasses
import itertools
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import torch

from constrained import UnwritableGrammar
from engine.block_pool import BlockPool
from engine.compiled_decode import CompiledDecode
from engine.config import DEFAULT_CPU_LONG_PREFILL_TOKENS, DEFAULT_CPU_PREFILL_TOKENS_PER_STEP, EngineConfig
from engine.detokenizer import IncrementalDetokenizer
from engine.errors import EngineStepError, InvalidSamplingParams
from engine.model_limits import ModelLimits
from engine.model_runner import ModelRunner
from engine.output_logprobs import LogprobAligner
from engine.request import CompletionDelta, EngineRequest, RequestOutput
from engine.sampler import Sampler
from engine.scheduler import Scheduler, SchedulerConfig, SchedulerOutput
from engine.sequence import FINISH_REASONS, Sequence, SeqStatus
from engine.stats import EngineStats
from engine.step_threads import StepThreads
from engine.structured_output import StructuredOutputManager
from engine.token_bytes import TokenBytes
from lora.errors import LoraAdapterNotFound, LoraNotEnabled
from lora.manager import LoraManager
from lora.registry import LoraAdapterInfo, LoraRegistry

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class RequestState:
    """Per-request bookkeeping: its sequences, their detokenizers, logprob aligners (None without
    logprobs) and unsent deltas."""

    request: EngineRequest
    seqs: list[Sequence]
    detokenizers: list[IncrementalDetokenizer]
    aligners: list[LogprobAligner] | None = None
    pending: dict[int, CompletionDelta] = field(default_factory=dict)
    grammar_future: Future[Any] | None = None
    prompt_counted: bool = False     # num_prompt_tokens counted (at the first prefill's sample)
    error: Exception | None = None   # set when a choice failed; the whole request then ends with it

    @property
    def finished(self) -> bool:
        """True once every choice has finished."""
        return all(s.status.is_finished for s in self.seqs)


class LLMEngine:
    """Owns the scheduler, block pool, model runner and sampler; `step()` runs one round.

    Not thread-safe: one thread (engine/async_engine.py) calls every method.
    """

    def __init__(self, config: EngineConfig, model: Any, arch: Any, tokenizer: Any,
                 device: torch.device, dtype: torch.dtype, max_model_len: int,
                 on_grammar_ready: Callable[[], None] | None = None,
                 compiled_decode: CompiledDecode | None = None, step_threads: StepThreads | None = None) -> None:
        """`compiled_decode`: a compiled decode step of `model` to use as it is (warmed up or warming
        up by its owner; tests share one); without it, `config.compile_decode` builds one and
        warms it up on a background thread (CPU only). `step_threads`: torch's thread count per
        step by its rows (engine/step_threads.py), set on the thread that calls `step`; None
        leaves torch's count alone."""
        self.config = config
        self.step_threads = step_threads
        self.tokenizer = tokenizer
        self.token_bytes = TokenBytes(tokenizer)
        self.arch = arch
        self.max_model_len = max_model_len
        self.limits = ModelLimits(arch.vocab_size, max_model_len)
        self.lora = LoraManager(config.lora, model.lora_spec(), dtype, device) if config.lora else None
        start_compile = compiled_decode is None and config.compile_decode and device.type == "cpu"
        if start_compile:
            compiled_decode = CompiledDecode(model, cache_dir=config.compile_cache_dir,
                                             threads_for=step_threads.threads_for if step_threads else None)
        elif compiled_decode is None and config.compile_decode:
            logger.info("compile_decode: the compiled decode step is built for CPU only; %s runs eager",
                        device.type)
        self.runner = ModelRunner(model, arch, device, dtype, config.block_size,
                                  config.kv_cache_memory_bytes, max_model_len, self.lora, compiled_decode)
        if start_compile and compiled_decode is not None:
            compiled_decode.start_warm_up(self.runner.kv_caches, self.runner.scratch_block)
        self.block_pool = BlockPool(self.runner.num_blocks, config.block_size, config.enable_prefix_caching)
        chunk_cap = _cap(config.long_prefill_token_threshold, DEFAULT_CPU_LONG_PREFILL_TOKENS, device)
        admission_cap = _cap(config.max_prefill_tokens_per_step, DEFAULT_CPU_PREFILL_TOKENS_PER_STEP, device)
        self.scheduler = Scheduler(
            SchedulerConfig(config.max_num_batched_tokens, config.max_num_seqs, max_model_len, chunk_cap,
                            admission_cap), self.block_pool, self.lora)
        self.eos_token_ids: tuple[int, ...] = tuple(arch.eos_token_ids)
        self.sampler = Sampler(arch.vocab_size, self.eos_token_ids, config.seed)
        self.requests: dict[str, RequestState] = {}
        self.structured = StructuredOutputManager(tokenizer, arch.vocab_size, self.eos_token_ids,
                                                  config.max_num_seqs, config.grammar, on_grammar_ready)
        self._compiling: list[RequestState] = []
        self.last_step_scheduled = False
        self._seq_ids = itertools.count()
        self.num_generation_tokens = 0
        self.num_prompt_tokens = 0

    def validate(self, request: EngineRequest) -> None:
        """Raise what `ModelLimits.validate` raises (token ids against the vocabulary, prompt +
        max_tokens against max_model_len) or LoraAdapterNotFound (an adapter name that is not
        loaded) for a request that cannot run on this model; any thread, no side effects. The one
        place these facts are checked."""
        self.limits.validate(request)
        if request.lora_name is not None and (self.lora is None or not self.lora.registry.has(request.lora_name)):
            raise LoraAdapterNotFound(f"The model `{request.lora_name}` does not exist.", param="model")

    def set_grammar_ready_callback(self, callback: Callable[[], None] | None) -> None:
        """Call `callback` (from the compile pool's threads) whenever a grammar compile finishes, so
        the thread stepping this engine can wake up for requests that were waiting for it."""
        self.structured.on_ready = callback

    def warm_up_grammars(self) -> None:
        """Run the grammar backends' one-time setup now (blocking) instead of in the first request."""
        self.structured.compiler.warm_up()

    @property
    def lora_enabled(self) -> bool:
        """True when the engine serves LoRA adapters (EngineConfig.lora set)."""
        return self.lora is not None

    def lora_adapters(self) -> list[LoraAdapterInfo]:
        """The loaded LoRA adapters in load order (empty when LoRA is off); any thread."""
        return [] if self.lora is None else self.lora.registry.adapters()

    def load_lora_adapter(self, name: str, path: str, replace: bool = False) -> LoraAdapterInfo:
        """Read and validate the PEFT folder `path` and serve it as `name` (blocking, any thread).
        Raises LoraNotEnabled, InvalidLoraAdapter, LoraAdapterExists (unless `replace`)."""
        return self._lora_registry().load(name, path, None, replace)

    def unload_lora_adapter(self, name: str) -> Future[None]:
        """Stop accepting `name` at once; the future completes when no sequence uses it any more.
        Raises LoraNotEnabled, LoraAdapterNotFound."""
        return self._lora_registry().unload(name)

    def _lora_registry(self) -> LoraRegistry:
        if self.lora is None:
            raise LoraNotEnabled("LoRA is off; start the server with --enable-lora")
        return self.lora.registry

    def add_request(self, request: EngineRequest, validated: bool = False) -> None:
        """Validate and queue a request: one Sequence per choice (n).

        `validated`: the caller has run `validate(request)` already (AsyncEngine.generate does, on
        the event loop, so a bad request fails before it is queued); it is not checked twice.
        Raises what `validate` raises.
        """
        if not validated:
            self.validate(request)
        if request.request_id in self.requests:   # a fact of this thread's state, checked here
            raise InvalidSamplingParams(f"duplicate request id {request.request_id}", param="request_id")
        params = request.sampling_params
        if params.max_tokens is None:
            params = dataclasses.replace(params, max_tokens=self.limits.max_tokens(request))
        adapter_id = 0
        if request.lora_name is not None and self.lora is not None:
            adapter_id = self.lora.begin_request(request.lora_name, params.n)   # per-load id: keys the prefix cache
        seqs: list[Sequence] = []
        detoks: list[IncrementalDetokenizer] = []
        for index in range(params.n):
            generator = None
            if params.seed is not None:
                # mod 2**64: manual_seed reads a negative seed as its uint64 two's complement
                # anyway, and seed 2**64 - 1 with n > 1 must not overflow
                generator = torch.Generator().manual_seed((params.seed + index) % 2**64)
            seq = Sequence(
                seq_id=next(self._seq_ids), request_id=request.request_id, index=index,
                token_ids=list(request.prompt_token_ids), num_prompt_tokens=len(request.prompt_token_ids),
                sampling_params=params, arrival_time=request.arrival_time or time.monotonic(),
                lora_name=request.lora_name, adapter_id=adapter_id, generator=generator,
                cache_salt=request.cache_salt)
            seqs.append(seq)
            detoks.append(IncrementalDetokenizer(self.tokenizer, params.stop, params.include_stop_str_in_output,
                                                 params.skip_special_tokens))
        aligners = None if params.logprobs is None else [LogprobAligner(self.token_bytes) for _ in seqs]
        state = RequestState(request, seqs, detoks, aligners)
        self.requests[request.request_id] = state
        if request.grammar_spec is not None:
            state.grammar_future = self.structured.submit(request.grammar_spec)
            if request.close_grammar:
                self.structured.prepare_closer()
            self._compiling.append(state)
            for seq in seqs:
                seq.status = SeqStatus.WAITING_FOR_GRAMMAR
        for seq in seqs:
            self.scheduler.add(seq)

    def abort_request(self, request_id: str) -> RequestOutput | None:
        """Finish every unfinished choice of the request with "abort" and free its blocks."""
        state = self.requests.pop(request_id, None)
        if state is None:
            return None
        for seq in state.seqs:
            if not seq.status.is_finished:
                self.scheduler.finish(seq, SeqStatus.FINISHED_ABORTED)
                state.pending[seq.index] = CompletionDelta(seq.index, [], "", finish_reason="abort")
        return self._make_output(state)

    def stats(self) -> EngineStats:
        """Counters and gauges now (safe to call from another thread: reads ints and locked snapshots)."""
        pool = self.block_pool
        return EngineStats(
            num_requests_running=len({s.request_id for s in list(self.scheduler.running)}),
            num_requests_waiting=len({s.request_id for s in list(self.scheduler.waiting)}),
            kv_cache_usage=pool.usage, num_blocks=pool.num_blocks, num_free_blocks=pool.num_free_blocks,
            prefix_cache_queries=pool.stats.queries, prefix_cache_hits=pool.stats.hits,
            prompt_tokens=self.num_prompt_tokens, generation_tokens=self.num_generation_tokens,
            num_preemptions=self.scheduler.num_preemptions, forced_tokens=self.structured.num_forced_tokens,
            closed_outputs=self.structured.num_closed_outputs,
            grammar_cache_hits=self.structured.compiler.stats().cache_hits,
            grammar_compile_seconds=self.structured.compile_seconds.snapshot(),
            lora_adapters_resident=self.lora.num_resident_adapters if self.lora is not None else 0,
            compiled_steps=self.runner.num_compiled_steps, eager_steps=self.runner.num_eager_steps)

    def has_work(self) -> bool:
        """True while any request is waiting or running."""
        return self.scheduler.has_work()

    @torch.inference_mode()
    def step(self) -> list[RequestOutput]:
        """Run one schedule + forward + sample round; returns outputs of requests that advanced
        (one per request: a grammar-forced prefix appended this step goes out with the prefill's
        first sampled token, or alone when it already ended the output)."""
        touched: dict[str, RequestState] = {}
        outputs = self._poll_grammars(touched)
        sched = self.scheduler.schedule()
        self.last_step_scheduled = bool(sched.scheduled)
        if sched.scheduled:
            self._run_scheduled(sched, touched)
        return outputs + [self._make_output(state) if state.error is None else self._fail(state)
                          for state in touched.values()]

    def _run_scheduled(self, sched: SchedulerOutput, touched: dict[str, RequestState]) -> None:
        """Forward `sched`, sample its sampling rows, append and jump-forward; adds each request
        that advanced to `touched`."""
        sampling = [item.seq for item in sched.scheduled if item.samples]
        fill = self.structured.start_fill(sampling)      # runs while the forward runs
        if self.step_threads is not None:
            self.step_threads.apply(sum(item.num_scheduled_tokens for item in sched.scheduled))
        logits = self.runner.execute(sched)
        self.scheduler.update_after_step(sched)
        if not sampling:
            return
        bitmask = fill.result() if fill is not None else None
        result = self.sampler.sample(logits, sampling, bitmask)
        for seq, token_id, logprob in zip(sampling, result.token_ids, result.logprobs):
            state = self.requests[seq.request_id]
            if seq.index == 0 and not state.prompt_counted:
                # the prompt counts once its prefill ran (not at add: a grammar may still fail it)
                self.num_prompt_tokens += seq.num_prompt_tokens
                state.prompt_counted = True
            finished = self._append_token(state, seq, token_id, logprob)
            if not finished and seq.matcher is not None and seq.sampling_params.logprobs is None:
                self._jump_forward(state, seq)
            touched[seq.request_id] = state
        self.num_generation_tokens += len(sampling)

    def _jump_forward(self, state: RequestState, seq: Sequence) -> None:
        """Append the grammar's forced tokens, then the closing when max_tokens is near.

        Where tokens are forced, the closing is also checked before them: a forced run (`",
        "opt_13": ` is 6 tokens in a tool call's fixed layout) can take the budget from above the
        closing's margin to below its length in one step, and the plan starts with those same
        forced tokens anyway.
        """
        closes = state.request.close_grammar
        forced = seq.matcher.forced_tokens()
        if closes and forced and self._close_if_due(state, seq):
            return
        if not self._fast_forward(state, seq, forced) and closes:
            self._close_if_due(state, seq)

    def _fail(self, state: RequestState) -> RequestOutput:
        """End every choice of a request one of whose choices failed; the output carries the error."""
        out = self.abort_request(state.request.request_id)
        assert out is not None
        out.error = state.error
        return out

    def _poll_grammars(self, touched: dict[str, RequestState]) -> list[RequestOutput]:
        """Give matchers to requests whose grammar compiled; fail those whose compile failed.

        A sequence whose grammar forces tokens from its very start (`<tool_call>\n{"name": "` of a
        forced hermes call) gets them appended now, before its first forward, as output tokens
        (`_fast_forward`): its prefill computes their K/V with the prompt's, and the prefill's
        sample is already the first free token. Not with logprobs (a forced token has no sampled
        logprob; the same rule as after a sampled token). Such requests are added to `touched`.
        """
        outputs: list[RequestOutput] = []
        still: list[RequestState] = []
        for state in self._compiling:
            future = state.grammar_future
            assert future is not None
            if state.request.request_id not in self.requests:
                continue                       # aborted while compiling
            if not future.done():
                still.append(state)
                continue
            error = future.exception()
            if error is not None:
                out = self.abort_request(state.request.request_id)
                if out is not None:
                    out.error = error
                    outputs.append(out)
                continue
            compiled = future.result()
            for seq in state.seqs:
                seq.matcher = self.structured.new_matcher(compiled)
                if seq.status is SeqStatus.WAITING_FOR_GRAMMAR:
                    seq.status = SeqStatus.WAITING
                if seq.num_output_tokens == 0 and seq.sampling_params.logprobs is None:
                    num_tokens = seq.num_tokens
                    self._jump_forward(state, seq)
                    if seq.num_tokens > num_tokens:
                        touched[state.request.request_id] = state
        self._compiling = still
        return outputs

    def _fast_forward(self, state: RequestState, seq: Sequence, forced: list[int]) -> bool:
        """Append `forced`, the tokens the grammar forces next (`Matcher.forced_tokens`), without
        sampling them (jump-forward); their K/V is computed in the next step as a short prefill.
        Counts them as forced and generation tokens. True when the sequence finished."""
        for token_id in forced:
            self.structured.num_forced_tokens += 1
            self.num_generation_tokens += 1
            if self._append_token(state, seq, token_id, None):
                return True
        return False

    def _close_if_due(self, state: RequestState, seq: Sequence) -> bool:
        """When the output budget is about to cut a constrained sequence, append its grammar
        closing and finish it with "length" (see EngineRequest.close_grammar); True when it did."""
        budget = min(seq.sampling_params.max_tokens - seq.num_output_tokens, self.max_model_len - seq.num_tokens)
        plan = self.structured.closing_tokens(seq.matcher, budget)
        if plan is None:
            return False
        for token_id in plan:
            self.num_generation_tokens += 1
            if self._append_token(state, seq, token_id, None):
                return True
        self._finish(state, seq, SeqStatus.FINISHED_LENGTH, flush=True)
        return True

    def _append_token(self, state: RequestState, seq: Sequence, token_id: int, logprob: Any) -> bool:
        """Append one token, advance the matcher, detokenize, check stops; True when finished.

        EOS and stop_token_ids end the sequence without their text reaching the output, even with
        skip_special_tokens=False (as in vLLM), and without a logprob entry; the other tokens'
        entries go out with their text (engine/output_logprobs.py). A stop token id or stop string
        ends it only where its grammar could end the output (`_stop_allowed`); elsewhere the token
        is ordinary text.
        """
        params = seq.sampling_params
        stop_allowed = self._stop_allowed(seq)   # before the matcher takes the token
        seq.token_ids.append(token_id)
        aligner = state.aligners[seq.index] if state.aligners is not None else None
        delta = state.pending.setdefault(
            seq.index, CompletionDelta(seq.index, [], "", [] if aligner is not None else None))
        delta.token_ids.append(token_id)
        detok = state.detokenizers[seq.index]
        status: SeqStatus | None = None
        text, stop_str = "", None
        if seq.matcher is not None and not seq.matcher.accept([token_id]):
            state.error = self._refused_token_error(seq, token_id)
            status = SeqStatus.FINISHED_ERROR
        elif token_id in self.eos_token_ids and not params.ignore_eos:
            status = SeqStatus.FINISHED_STOPPED
        elif token_id in params.stop_token_ids and stop_allowed:
            status, seq.stop_reason = SeqStatus.FINISHED_STOPPED, token_id
        else:
            text_before = len(detok.text)
            text, stop_str = detok.add_tokens([token_id], stop_allowed)
            if aligner is not None and logprob is not None:
                aligner.add(logprob, detok.text[text_before:])
            if stop_str is not None:
                status, seq.stop_reason = SeqStatus.FINISHED_STOPPED, stop_str
            elif seq.num_output_tokens >= params.max_tokens or seq.num_tokens >= self.max_model_len:
                status = SeqStatus.FINISHED_LENGTH
        delta.text += text
        if aligner is not None and delta.logprobs is not None:
            delta.logprobs.extend(aligner.release(text))
        if status is not None:
            self._finish(state, seq, status, flush=stop_str is None)
        return status is not None

    def _refused_token_error(self, seq: Sequence, token_id: int) -> Exception:
        """The error of a sequence whose matcher refused its sampled `token_id` (already appended to
        its token_ids); output the grammar refused is never returned. Either the grammar reached a
        dead end (`Matcher.is_dead_end`: its bitmask allowed no token, so the sample was arbitrary;
        the client's format needs text this vocabulary cannot write: UnwritableGrammar, a 400), or
        the bitmask and the matcher disagree (an engine fault, logged: EngineStepError, a 500)."""
        if seq.matcher.is_dead_end():
            written = seq.num_output_tokens - 1
            return UnwritableGrammar(
                f"the requested format cannot be continued after {written} output token{'' if written == 1 else 's'}: "
                "no token of this model's vocabulary can write what it requires next")
        logger.error("request %s: grammar rejected sampled token %d; failing the request", seq.request_id, token_id)
        return EngineStepError(f"the grammar rejected sampled token {token_id}; the output would not match the "
                               "requested format")

    @staticmethod
    def _stop_allowed(seq: Sequence) -> bool:
        """Whether a stop string or stop token id may end `seq` at its next token: always without a
        grammar; with one, only where the grammar could end the output now (`Matcher.is_accepting`).

        The rule for stops inside a constrained region (a forced tool call, a triggered call in
        "auto" from its trigger to its end, a json_schema document): they are not matched there,
        since cutting there could only return output the grammar refuses (a call or document that
        does not parse). vLLM and SGLang match stops anywhere and return the cut text; here the
        output stays valid by construction and finish_reason tells what ended it.
        """
        params = seq.sampling_params
        if seq.matcher is None or not (params.stop or params.stop_token_ids):
            return True
        return seq.matcher.is_accepting()

    def _finish(self, state: RequestState, seq: Sequence, status: SeqStatus, flush: bool) -> None:
        """End `seq` with `status`; `flush`: release the detokenizer's held-back text last (not
        after a stop string, which cut the text), and the logprob entries of what was released.
        A stop string the flush completes (a trailing incomplete character's U+FFFD) cuts the text
        there and ends `seq` as stopped by it, whatever `status` said (max_tokens, EOS)."""
        delta = state.pending[seq.index]
        detok = state.detokenizers[seq.index]
        text_before = len(detok.text)
        tail, stop_str = detok.flush() if flush else ("", None)
        if stop_str is not None:
            status, seq.stop_reason = SeqStatus.FINISHED_STOPPED, stop_str
        delta.text += tail
        if state.aligners is not None and delta.logprobs is not None:
            aligner = state.aligners[seq.index]
            aligner.add_text(detok.text[text_before:])
            delta.logprobs.extend(aligner.finish(tail))
        self.scheduler.finish(seq, status)
        delta.finish_reason = FINISH_REASONS[status]
        delta.stop_reason = seq.stop_reason

    def _make_output(self, state: RequestState) -> RequestOutput:
        deltas = [state.pending[i] for i in sorted(state.pending)]
        state.pending = {}
        finished = state.finished
        rid = state.request.request_id
        if finished:
            self.requests.pop(rid, None)
        return RequestOutput(
            request_id=rid, deltas=deltas, num_prompt_tokens=len(state.request.prompt_token_ids),
            num_cached_tokens=state.seqs[0].num_cached_tokens,
            num_output_tokens=sum(s.num_output_tokens for s in state.seqs), finished=finished)

    def fail_all(self, error: Exception) -> list[RequestOutput]:
        """Finish every request with `error` (the engine cannot go on); frees all blocks."""
        outputs = []
        for rid in list(self.requests):
            out = self.abort_request(rid)
            if out is not None:
                out.error = error
                outputs.append(out)
        return outputs


def _cap(value: int | None, cpu_default: int, device: torch.device) -> int:
    """A per-step token cap of EngineConfig (0 = none): `value` when set, else `cpu_default` on CPU
    (where a step costs about its token count) and no cap elsewhere."""
    if value is not None:
        return value
    return cpu_default if device.type == "cpu" else 0
