"""How one choice ended: the single finish_reason decision every endpoint reports.

The engine ends a choice with "stop" (EOS, a stop string, a stop token id, or the grammar ending:
a terminated grammar allows only EOS) or "length" (max_tokens or the context; `closed` when the
grammar closing, `--close-tool-calls` / `--close-structured-outputs`, ended the output so that it
still matches the grammar). Stop strings and stop token ids never end a choice inside a
grammar-constrained call (`engine.LLMEngine._stop_allowed`), so with a grammar a call is open at
"stop" only in parse-only mode (`--no-constrain-auto-tools`). Aborts, timeouts and engine errors
are not endings: they fail the request (503 / 408 / 500, or an error event once a stream started).

Reading the tool calls (`api/generation/reader.py`) then decides, once per choice:

| engine ends | the calls at the end | finish_reason |
| --- | --- | --- |
| stop | calls made, none left open | tool_calls |
| stop | no call, or one left open | stop |
| length, closed | calls made (the closed call is whole) | tool_calls |
| length | otherwise (a call cut, or text cut) | length |

What is left of a call still open at the end: with a forced tool_choice (required / named) it is
dropped, so call markup never becomes content; with "auto" its text is content, so text the model
wrote is never silently dropped. Each endpoint maps the decision in one table: chat and
completions report it as is, Anthropic's stop_reason is tool_use / max_tokens / stop_sequence /
end_turn (`api/messages/output.py`), a Responses response is "incomplete" (max_output_tokens)
exactly when it is "length" (`api/responses/run.py`).
"""

from __future__ import annotations


def decide_finish_reason(engine_reason: str, made_calls: bool, left_open: bool, closed: bool) -> str:
    """The choice's finish_reason from the engine's ("stop" or "length"), whether it made tool
    calls, whether a call (or text that could still have become one) was left open at the end, and
    whether the grammar closing ended it; see the module table."""
    if engine_reason == "stop":
        return "tool_calls" if made_calls and not left_open else "stop"
    if engine_reason == "length" and closed and made_calls and not left_open:
        return "tool_calls"
    return engine_reason
