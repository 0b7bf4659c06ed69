"""Chat's edge of tool calling: what a choice's OutputReader reads -> `delta` messages.

A call streams in OpenAI's shape: its first delta carries `index`, `id`, `type: "function"`,
`function.name` and `function.arguments: ""`, the later ones argument fragments only
(`{"index": i, "function": {"arguments": "..."}}`), as they are generated; the fragments of a call
concatenate to its final arguments. Content text keeps its place around the calls (Read.events).
"""

from __future__ import annotations

from api.chat.protocol import DeltaFunctionCall, DeltaMessage, DeltaToolCall
from api.generation.reader import OutputReader
from toolparsers import ToolCallDelta


class ToolCallDeltas:
    """The delta messages of one choice: content, call headers and argument fragments in output order."""

    def __init__(self, reader: OutputReader) -> None:
        self.reader = reader

    def deltas(self, text: str, engine_reason: str | None = None) -> list[DeltaMessage]:
        """Delta messages for the next text delta; with `engine_reason` (the engine ended the
        choice), also everything the reader still holds (`OutputReader.finish`)."""
        read = self.reader.feed(text)
        if engine_reason is not None:
            read.extend(self.reader.finish(engine_reason))
        messages = []
        for event in read.events:
            if isinstance(event, str):
                messages.append(DeltaMessage(content=event))
            elif isinstance(event, ToolCallDelta):
                messages.append(DeltaMessage(tool_calls=[_delta_tool_call(event)]))
        return messages


def _delta_tool_call(delta: ToolCallDelta) -> DeltaToolCall:
    if delta.id is not None:   # the header: id, type, name and arguments ""
        header = DeltaFunctionCall(name=delta.name, arguments="")
        return DeltaToolCall(index=delta.index, id=delta.id, type="function", function=header)
    return DeltaToolCall(index=delta.index, function=DeltaFunctionCall(arguments=delta.arguments_delta))
