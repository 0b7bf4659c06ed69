"""Counting a request's parsed tool calls by validity: tool_calls_total{validity="valid"|"invalid"},
timing each choice's first tool-call delta: time_to_first_tool_call_delta_seconds, and counting each
choice's ending by the finish_reason the client got: request_success_total (a tool parser's reading
decides it, `api/generation/ending.py`, so the StreamTracker leaves it to this counter).

A call is valid when it names one of the request's tools and its arguments are a JSON object that
validates against that tool's parameters schema (jsonschema, the schema's own draft, formats not
asserted). Grammar-constrained calls should always be valid; invalid ones show unconstrained
output (`--no-constrain-auto-tools`) or a backend that enforced less than the schema says.
"""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Sequence
from typing import Any

import jsonschema
import referencing.exceptions
from fastapi import Request
from jsonschema import validators

from api.observability.metrics import ServingMetrics, app_metrics
from api.observability.request_log import RequestRecord, request_record
from api.generation.constraints import ToolCalling
from toolparsers import ToolCall as ParsedCall
from toolparsers import ToolSpec


class ToolCallCounter:
    """A ToolCallObserver for one request: counts each call in `metrics` and in `record` (when given),
    observes each choice's first tool-call delta `time.monotonic() - arrival_time` seconds after
    the request arrived (EngineRequest.arrival_time), and counts each choice's decided finish_reason
    in request_success and the record's finish reasons.

    Validators are built once per tool, on its first call. Never raises on odd calls or schemas.
    """

    def __init__(self, metrics: ServingMetrics, tools: Sequence[ToolSpec], record: RequestRecord | None,
                 arrival_time: float) -> None:
        self.metrics = metrics
        self.record = record
        self.arrival_time = arrival_time
        self._schemas = {tool.name: tool.parameters for tool in tools}
        self._validators: dict[str, Any] = {}

    def __call__(self, calls: list[ParsedCall]) -> None:
        """Count `calls` (the calls completed in one parsed piece of output)."""
        for call in calls:
            self.metrics.count_tool_call(self.is_valid(call))
        if self.record is not None:
            self.record.num_tool_calls += len(calls)

    def first_delta(self) -> None:
        """A choice read its first tool-call delta just now (once per choice: the reader calls it)."""
        self.metrics.observe_first_tool_call_delta(time.monotonic() - self.arrival_time)

    def finished(self, finish_reason: str) -> None:
        """A choice ended with `finish_reason` as decided by its reader ("tool_calls", "stop", "length")."""
        self.metrics.count_success(finish_reason)
        if self.record is not None:
            self.record.finish_reasons.append(finish_reason)

    def is_valid(self, call: ParsedCall) -> bool:
        """Whether `call` names a known tool and its arguments validate against the tool's schema."""
        schema = self._schemas.get(call.name)
        if schema is None:
            return False
        try:
            arguments = json.loads(call.arguments)
        except ValueError:
            return False
        if not isinstance(arguments, dict):
            return False
        validator = self._validators.get(call.name)
        if validator is None:
            with warnings.catch_warnings():  # an unknown $schema URI warns; the default draft is used
                warnings.simplefilter("ignore")
                validator = validators.validator_for(schema, default=validators.Draft202012Validator)(schema)
            self._validators[call.name] = validator
        try:
            return bool(validator.is_valid(arguments))
        except (jsonschema.SchemaError, referencing.exceptions.Unresolvable, RecursionError):
            return False  # a schema jsonschema cannot apply: the call cannot be shown valid


def tool_call_counter(
    request: Request, tool_calling: ToolCalling | None, arrival_time: float
) -> ToolCallCounter | None:
    """The counter for `request`'s tool calls (`arrival_time`: its EngineRequest's, time.monotonic()
    seconds); None when it parses none or the app has no metrics."""
    metrics = app_metrics(request)
    if tool_calling is None or metrics is None:
        return None
    return ToolCallCounter(metrics, tool_calling.tools, request_record(request), arrival_time)
