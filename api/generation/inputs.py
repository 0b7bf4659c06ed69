"""GenerationInputs: what an endpoint's request means for generation, as plain dataclasses.

Each endpoint translates its own body into these once (`api/<endpoint>/translate.py`); from here
on chat, Responses and /tokenize run the same code. Field paths (`param`, `parameters_param`,
`RenderOptions.prompt_param`) are the endpoint's own, so a 400 names the field the client sent.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from constrained.spec import GrammarSpec
from engine import SamplingParams
from toolparsers import ToolCall

Role = Literal["system", "user", "assistant", "tool"]


@dataclass(frozen=True, slots=True)
class Message:
    """One conversation turn as the chat template sees it: text content (list content already
    joined, `developer` already `system`), tool calls of an assistant turn, the call a tool result
    answers."""

    role: Role
    content: str = ""
    name: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()   # the calls of an earlier assistant turn
    tool_call_id: str | None = None


@dataclass(frozen=True, slots=True)
class FunctionTool:
    """One function tool: `parameters` is the JSON schema of its arguments object (None: no
    arguments); `parameters_param` is the schema's request field path ("tools[0].function.parameters")."""

    name: str
    parameters_param: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    def template_dict(self) -> dict[str, Any]:
        """The OpenAI tool object a chat template reads (`{"type": "function", "function": {...}}`,
        unset keys left out)."""
        function: dict[str, Any] = {"name": self.name}
        for key in ("description", "parameters", "strict"):
            value = getattr(self, key)
            if value is not None:
                function[key] = value
        return {"type": "function", "function": function}


@dataclass(frozen=True, slots=True)
class NamedTool:
    """tool_choice naming one function: exactly this function is called, once."""

    name: str


ToolChoice = Literal["none", "auto", "required"] | NamedTool


@dataclass(frozen=True, slots=True)
class RequestGrammar:
    """A constraint and `param`, the request field it came from (named by the 400 when a grammar
    backend cannot compile it)."""

    spec: GrammarSpec
    param: str


@dataclass(frozen=True, slots=True)
class GrammarOptions:
    """vLLM `structured_outputs` options; they apply to the format's grammar and the tool grammar.

    `backend` None: the server's default.
    """

    backend: str | None = None
    any_whitespace: bool = True
    additional_properties: bool = True


@dataclass(frozen=True, slots=True)
class RenderOptions:
    """How to render the conversation: generation prompt or continuation of the last assistant
    turn, extra template variables, whether encoding adds special tokens. `prompt_param` names the
    request field holding the conversation in 400s ("input" on /v1/responses)."""

    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    add_special_tokens: bool = False
    prompt_param: str = "messages"


@dataclass(frozen=True, slots=True)
class ToolInputs:
    """The tool fields of a request: its tools, tool_choice (None: "auto" with tools, else
    "none") and parallel_tool_calls (None: allowed)."""

    tools: tuple[FunctionTool, ...] = ()
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None


@dataclass(frozen=True, slots=True)
class GenerationInputs:
    """One conversation to answer.

    `output_format`: the grammar of response_format / structured_outputs / text.format (None: free
    text). `sampling.max_tokens` is the requested output budget (None: what the prompt leaves of
    the context; the engine checks it against the context, `LLMEngine.validate`).
    `adapter`: the LoRA adapter name (None: the base model). `cache_salt`: the prefix-cache salt
    (vLLM's field; None: none), see EngineRequest.
    """

    messages: tuple[Message, ...]
    sampling: SamplingParams
    tools: ToolInputs = field(default_factory=ToolInputs)
    output_format: RequestGrammar | None = None
    grammar_options: GrammarOptions | None = None
    render: RenderOptions = field(default_factory=RenderOptions)
    adapter: str | None = None
    cache_salt: str | None = None
