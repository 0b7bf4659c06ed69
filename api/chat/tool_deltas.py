"""Chat's edge of tool calling: what a choice's OutputReader reads -> `delta` messages.

Per call the client gets two deltas, in OpenAI's observed shape: first `index`, `id`,
`type: "function"`, `function.name` and `function.arguments: ""`, then the arguments text. A call
is sent once the reader has it whole, so its arguments are always the final JSON.
"""

from __future__ import annotations

from api.chat.protocol import DeltaFunctionCall, DeltaMessage, DeltaToolCall
from api.generation.reader import OutputReader, Read


class ToolCallDeltas:
    """The deltas of one choice: content first, then two deltas per completed call (header, then
    arguments); calls are numbered 0, 1, ... in order."""

    def __init__(self, reader: OutputReader) -> None:
        self.reader = reader
        self._num_calls = 0

    def deltas(self, text: str, engine_reason: str | None = None) -> list[DeltaMessage]:
        """Delta messages for the next text delta; with `engine_reason` (the engine ended the
        choice), also everything the reader still holds (`OutputReader.finish`)."""
        read = self.reader.feed(text)
        if engine_reason is not None:
            rest = self.reader.finish(engine_reason)
            read = Read(read.content + rest.content, read.tool_calls + rest.tool_calls)
        messages = [DeltaMessage(content=read.content)] if read.content else []
        for call in read.tool_calls:
            index, self._num_calls = self._num_calls, self._num_calls + 1
            header = DeltaFunctionCall(name=call.name, arguments="")
            messages.append(DeltaMessage(tool_calls=[DeltaToolCall(index=index, id=call.id, type="function",
                                                                   function=header)]))
            arguments = DeltaFunctionCall(arguments=call.arguments)
            messages.append(DeltaMessage(tool_calls=[DeltaToolCall(index=index, function=arguments)]))
        return messages
