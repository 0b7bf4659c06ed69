"""A /v1/messages (or count_tokens) body -> GenerationInputs, once.

The conversation as the chat template sees it (`api/generation/inputs.py` Message):
- `system` (a string or text blocks, joined by newlines) is one system turn first;
- a user turn's text blocks are one user turn; each tool_result block is a `tool` turn answering
  `tool_use_id`, in the order sent (an `is_error` result's text is prefixed with "Error: ", since
  chat templates have no field for it);
- an assistant turn's text blocks are its content and its tool_use blocks its tool calls (input
  as JSON text).

tool_choice auto / any / tool / none is chat's auto / required / named / none, and
`disable_parallel_tool_use` is `parallel_tool_calls: false`; the grammar rules are chat's
(`api/generation/constraints.py`). `output_config.format` json_schema is chat's json_schema
response format.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from api.errors import InvalidRequest
from api.generation.constraints import json_schema_grammar
from api.generation.inputs import (
    FunctionTool,
    GenerationInputs,
    Message,
    NamedTool,
    RequestGrammar,
    ToolChoice,
    ToolInputs,
)
from api.messages.protocol import (
    CountTokensRequest,
    CustomTool,
    InputMessage,
    MessagesRequest,
    TextBlock,
    ToolChoiceAny,
    ToolChoiceNone,
    ToolChoiceTool,
    ToolResultBlock,
    ToolUseBlock,
    UnsupportedTool,
)
from api.messages.protocol import ToolChoice as MessagesToolChoice
from api.protocol.sampling import sampling_params
from engine import SamplingParams
from toolparsers import ToolCall

_ERROR_PREFIX = "Error: "


def translate(body: CountTokensRequest, adapter: str | None) -> GenerationInputs:
    """The generation inputs of `body` on `adapter` (None: the base model). A MessagesRequest
    brings its max_tokens, stop_sequences and sampling; a CountTokensRequest only the prompt
    (its budget is the context). Walks the output schema: call it off the event loop.

    Raises InvalidRequest for a malformed output_config.format.schema or a block in the wrong
    turn; InvalidSamplingParams for
    out-of-range or inconsistent sampling values.
    """
    if isinstance(body, MessagesRequest):
        sampling = sampling_params(
            {"stop": "stop_sequences"},
            temperature=1.0 if body.temperature is None else body.temperature,
            top_p=1.0 if body.top_p is None else body.top_p,
            top_k=-1 if body.top_k is None else body.top_k,
            max_tokens=body.max_tokens,
            stop=tuple(body.stop_sequences or ()),
        )
    else:
        sampling = SamplingParams(max_tokens=None)
    return GenerationInputs(
        messages=conversation(body.system, body.messages),
        sampling=sampling,
        tools=tool_inputs(body.tools, body.tool_choice),
        output_format=_output_format(body),
        adapter=adapter,
    )


def conversation(system: str | list[TextBlock] | None, messages: Sequence[InputMessage]) -> tuple[Message, ...]:
    """The system prompt and the turns as chat-template messages (see the module docstring).

    Raises InvalidRequest (param `messages[i].content[j]`) for a tool_use block in a user turn or
    a tool_result block in an assistant turn.
    """
    turns: list[Message] = []
    if system:
        turns.append(Message(role="system", content=_joined(system)))
    for i, message in enumerate(messages):
        if isinstance(message.content, str):
            turns.append(Message(role=message.role, content=message.content))
            continue
        misplaced = ToolResultBlock if message.role == "assistant" else ToolUseBlock
        for j, block in enumerate(message.content):
            if isinstance(block, misplaced):
                raise InvalidRequest(
                    f"a {block.type} block cannot be in a {message.role} turn "
                    "(tool_use belongs to assistant turns, tool_result to user turns)",
                    param=f"messages[{i}].content[{j}]",
                )
        turns.extend([_assistant_turn(message)] if message.role == "assistant" else _user_turns(message))
    return tuple(turns)


def _assistant_turn(message: InputMessage) -> Message:
    texts = [block.text for block in message.content if isinstance(block, TextBlock)]
    calls = tuple(
        ToolCall(id=block.id, name=block.name, arguments=json.dumps(block.input, ensure_ascii=False))
        for block in message.content
        if isinstance(block, ToolUseBlock)
    )
    return Message(role="assistant", content="\n".join(texts), tool_calls=calls)


def _user_turns(message: InputMessage) -> list[Message]:
    """Consecutive text blocks make one user turn; each tool_result block a tool turn."""
    turns: list[Message] = []
    texts: list[str] = []
    for block in message.content:
        if isinstance(block, TextBlock):
            texts.append(block.text)
        elif isinstance(block, ToolResultBlock):
            if texts:
                turns.append(Message(role="user", content="\n".join(texts)))
                texts = []
            content = _joined(block.content or "")
            if block.is_error:
                content = _ERROR_PREFIX + content
            turns.append(Message(role="tool", content=content, tool_call_id=block.tool_use_id))
    if texts or not turns:
        turns.append(Message(role="user", content="\n".join(texts)))
    return turns


def _joined(content: str | list[TextBlock]) -> str:
    return content if isinstance(content, str) else "\n".join(block.text for block in content)


def tool_inputs(
    tools: Sequence[CustomTool | UnsupportedTool] | None, choice: MessagesToolChoice | None
) -> ToolInputs:
    """`tools` (client tools; the protocol already refused server tools) and `tool_choice`;
    schema paths read `tools[i].input_schema`."""
    return ToolInputs(
        tools=tuple(
            FunctionTool(
                name=tool.name,
                parameters_param=f"tools[{i}].input_schema",
                description=tool.description,
                parameters=tool.input_schema,
            )
            for i, tool in enumerate(tools or ())
            if isinstance(tool, CustomTool)
        ),
        tool_choice=_choice(choice),
        parallel_tool_calls=False if getattr(choice, "disable_parallel_tool_use", None) else None,
    )


def _choice(choice: MessagesToolChoice | None) -> ToolChoice | None:
    if choice is None:
        return None
    if isinstance(choice, ToolChoiceTool):
        return NamedTool(choice.name)
    if isinstance(choice, ToolChoiceAny):
        return "required"
    if isinstance(choice, ToolChoiceNone):
        return "none"
    return "auto"


def _output_format(body: CountTokensRequest) -> RequestGrammar | None:
    fmt = body.output_config.format if body.output_config is not None else None
    if fmt is None:
        return None
    return json_schema_grammar(fmt.json_schema, "output_config.format.schema")
