"""Streaming tool-call parsing for one choice: engine text deltas in, chunk deltas out.

Per call the client gets two deltas, in OpenAI's observed shape: first `index`, `id`,
`type: "function"`, `function.name` and `function.arguments: ""`, then the arguments text. A call
is sent once the parser has it complete, so its arguments are always the final JSON. Text the
parser holds back (a partial `<tool_call>` marker) is never sent as content; text that turns out
not to be a call is sent as content when that is decided (at the latest at the end).
"""

from __future__ import annotations

from api.protocol.chat_response import DeltaFunctionCall, DeltaMessage, DeltaToolCall
from api.tool_calls import ToolCallObserver, finish_reason_with_calls
from toolparsers import ParseResult, ToolCallDelta, ToolParser


class ToolCallStream:
    """The tool-call streaming state of one choice (one parser; `parse`/`deltas` until `final`).

    `on_calls`, when given, sees each call once, when the parser completes it.
    """

    def __init__(self, parser: ToolParser, on_calls: ToolCallObserver | None = None) -> None:
        self._parser = parser
        self._on_calls = on_calls
        self.made_calls = False

    def parse(self, text: str, final: bool, cut: bool = False) -> ParseResult:
        """The parser's result for the next text delta; with `final`, also everything held back
        (`cut`: the output stopped at max_tokens, so a held-back partial call is dropped)."""
        result = self._parser.feed(text) if text else ParseResult()
        if final:
            result.extend(self._parser.finish(cut))
        if result.tool_calls:
            self.made_calls = True
            if self._on_calls is not None:
                self._on_calls(result.tool_calls)
        return result

    def deltas(self, text: str, final: bool, cut: bool = False) -> list[DeltaMessage]:
        """Chunk deltas for the next text delta; with `final`, also everything still held back
        (see `parse` for `cut`).

        Content comes first, then one delta per tool-call piece (header, then arguments).
        """
        result = self.parse(text, final, cut)
        messages = [DeltaMessage(content=result.content)] if result.content else []
        for piece in result.deltas:
            messages.append(DeltaMessage(tool_calls=[delta_tool_call(piece)]))
        return messages

    def finish_reason(self, engine_reason: str) -> str:
        """The choice's finish_reason: "tool_calls" once a call was streamed, else the engine's."""
        return finish_reason_with_calls(engine_reason, self.made_calls) or engine_reason


def delta_tool_call(piece: ToolCallDelta) -> DeltaToolCall:
    """One `delta.tool_calls[]` entry: the call's header (id set) or an arguments fragment."""
    if piece.id is not None:
        return DeltaToolCall(
            index=piece.index,
            id=piece.id,
            type="function",
            function=DeltaFunctionCall(name=piece.name, arguments=piece.arguments_delta),
        )
    return DeltaToolCall(index=piece.index, function=DeltaFunctionCall(arguments=piece.arguments_delta))
