"""Timing one engine request's outputs as the api receives them: latency metrics and the log record."""

from __future__ import annotations

import time

from fastapi import Request

from api.observability.metrics import ServingMetrics, app_metrics
from api.observability.request_log import RequestRecord, request_record
from engine import EngineRequest, RequestOutput


class StreamTracker:
    """Per engine request, on the event loop: per choice, the first output carrying tokens observes
    time to first token, later ones inter-token latency, and its finish (not an abort) end-to-end
    latency and request_success; all from `request.arrival_time` (time.monotonic() seconds).

    The request's totals, finish reasons and outcome go into `record` (when given) at `closed`.
    With `hold_record`, the record's log line also waits for `closed` (a background response).
    With `reads_calls` (a ToolCallCounter sees the request's tool parsing,
    api/observability/tool_call_metrics.py), the finish reason is the parser's decision, not the
    engine's: request_success and the record's finish reasons are left to that counter.
    """

    def __init__(self, metrics: ServingMetrics | None, record: RequestRecord | None, request: EngineRequest,
                 hold_record: bool = False, reads_calls: bool = False) -> None:
        self.metrics = metrics
        self.record = record
        self.arrival_time = request.arrival_time or time.monotonic()
        num_choices = request.sampling_params.n
        self._last_token_at: list[float | None] = [None] * num_choices
        self._finish_reasons: list[str | None] = [None] * num_choices
        self._totals = (0, 0)  # (prompt tokens, output tokens) of the latest output
        self._closed = False
        self._held = hold_record and record is not None
        self._reads_calls = reads_calls
        if record is not None:
            record.adapter = request.lora_name
            record.model = request.lora_name or (metrics.model_name if metrics is not None else None)
            if self._held:
                record.hold()

    def on_output(self, out: RequestOutput) -> None:
        """Account one output (call it as soon as it arrives)."""
        now = time.monotonic()
        metrics = self.metrics
        for delta in out.deltas:
            if delta.token_ids:
                last = self._last_token_at[delta.index]
                if last is None:
                    if metrics is not None:
                        metrics.observe_first_token(now - self.arrival_time)
                    if self.record is not None and self.record.first_token_at is None:
                        self.record.first_token_at = now
                elif metrics is not None:
                    metrics.observe_inter_token(now - last)
                self._last_token_at[delta.index] = now
            reason = delta.finish_reason
            if reason is not None and reason != "abort":
                self._finish_reasons[delta.index] = reason
                if metrics is not None:
                    metrics.observe_finished(now - self.arrival_time)
                    if not self._reads_calls:
                        metrics.count_success(reason)
        self._totals = (out.num_prompt_tokens, out.num_output_tokens)

    def failed(self, exc: BaseException) -> None:
        """The request failed with `exc` (noted as the record's error unless one is noted already)."""
        if self.record is not None and self.record.error is None:
            self.record.error = type(exc).__name__

    def closed(self, finished: bool) -> None:
        """The stream was closed (`finished`: the engine finished it); idempotent."""
        if self._closed:
            return
        self._closed = True
        record = self.record
        if record is None:
            return
        record.num_prompt_tokens += self._totals[0]
        record.num_output_tokens += self._totals[1]
        if not self._reads_calls:
            record.finish_reasons.extend(r for r in self._finish_reasons if r is not None)
        if not finished and record.error is None:
            record.aborted = True
        if self._held:
            record.release()


def track(request: Request, engine_request: EngineRequest, hold_record: bool = False,
          reads_calls: bool = False) -> StreamTracker:
    """A StreamTracker for `engine_request`, reporting to the app's metrics and the HTTP request's
    record; `reads_calls`: a ToolCallCounter counts its decided finish reasons (StreamTracker)."""
    record = request_record(request)
    return StreamTracker(app_metrics(request), record, engine_request, hold_record, reads_calls)
