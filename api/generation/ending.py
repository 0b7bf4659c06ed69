"""How one choice ended: the single finish_reason decision every endpoint reports.

The engine ends a choice with "stop" (EOS, a stop string, a stop token id, or the grammar ending:
a terminated grammar allows only EOS; also a stop string completed by the U+FFFD that max_tokens
flushes for a cut character) or "length" (max_tokens or the context; with `--close-tool-calls`
the grammar closing first completes a call the budget would cut, in every call format, so that
call is whole). Stop strings and stop token ids never end a choice inside a grammar-constrained
call (`engine.LLMEngine._stop_allowed`), so with a grammar a call is open at "stop" only in
parse-only mode (`--no-constrain-auto-tools`). Aborts, timeouts and engine errors are not
endings: they fail the request (503 / 408 / 500, or an error event once a stream started).

Reading the tool calls (`api/generation/reader.py`) then decides, once per choice:

| engine ends | the calls at the end | finish_reason |
| --- | --- | --- |
| stop or length | whole calls, and no call left open (or, forced, the open one dropped) | tool_calls |
| stop | no call, or ("auto") a call left open: its text as content, or the call cut (see below) | stop |
| length | no call, or ("auto") a call left open: its text as content, or the call cut (see below) | length |

What is left of a call still open at the end (`OutputReader.finish`): with a forced tool_choice
(required / named) it is dropped from the answer (`parser.finish(cut=True)`), so call markup never
becomes content, and the whole calls before it are the answer (shared cases 001 and 004: a 135M
model that loops on parallel calls until max_tokens still answers "tool_calls"). A stream has
already sent its header and argument fragments (arguments stream as generated; a delta cannot be
taken back): chat's stream ends with finish_reason "length" (or "tool_calls" when earlier calls
were whole), Responses closes its item "incomplete" and Messages stops its block, and both leave
it out of the final object. With "auto" (`parser.finish(cut=False)`) text the model wrote is never
silently dropped: a call whose header already streamed comes back as that call, its arguments the
model's text verbatim (not JSON; `ParseResult.cut_call_ids`, `OutputReader.cut_call_ids`: a
Responses item with status "incomplete"), and undecided text with no header yet (a partial
marker) is content; either way the call was left open, so finish_reason is the
engine's ("length", or "stop" for a stop string in parse-only mode), never "tool_calls". Stream
and whole answers therefore agree, except that a stream shows a dropped forced call partially.
Each endpoint maps the decision in one table: chat reports it as is, Anthropic's stop_reason is
tool_use / max_tokens / stop_sequence / end_turn (`api/messages/output.py`), a Responses response
is "incomplete" (max_output_tokens) exactly when it is "length" (`api/responses/run.py`). The
request_success metric and the request log count this decision too, not the engine's reason
(`api/observability/tool_call_metrics.py`).
"""

from __future__ import annotations


def decide_finish_reason(engine_reason: str, made_calls: bool, left_open: bool) -> str:
    """The choice's finish_reason from the engine's ("stop" or "length"), whether it returned
    whole tool calls, and whether ("auto") a call was left open at the end: text that could still
    have become one returned as content, or a call whose header streamed returned with its
    arguments cut; see the module table."""
    if made_calls and not left_open:
        return "tool_calls"
    return engine_reason
