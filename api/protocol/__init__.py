"""Pydantic models of the OpenAI (and vLLM) request and response bodies, field names verbatim."""

from api.protocol.chat_request import ChatCompletionRequest
from api.protocol.chat_response import (
    ChatCompletion,
    ChatCompletionChoice,
    ChatCompletionChunk,
    ChatCompletionChunkChoice,
    ChatCompletionMessage,
    DeltaFunctionCall,
    DeltaMessage,
    DeltaToolCall,
)
from api.protocol.common import ErrorInfo, ErrorResponse, PromptTokensDetails, StreamOptions, Usage
from api.protocol.completion_request import CompletionRequest
from api.protocol.completion_response import Completion, CompletionChoice
from api.protocol.logprobs import ChatTokenLogprob, ChoiceLogprobs, CompletionLogprobs, TopLogprob
from api.protocol.messages import (
    AssistantMessage,
    ChatMessage,
    ContentPart,
    DeveloperMessage,
    FunctionCall,
    FunctionDefinition,
    NamedToolChoice,
    ResponseFormatJsonObject,
    ResponseFormatJsonSchema,
    ResponseFormatText,
    SystemMessage,
    Tool,
    ToolCall,
    ToolMessage,
    UserMessage,
)
from api.protocol.models import ModelCard, ModelList
from api.protocol.responses_events import StreamEvent
from api.protocol.responses_items import InputItem
from api.protocol.responses_object import InputItemList, ResponseDeleted, ResponseObject, ResponseUsage
from api.protocol.responses_request import ResponsesRequest
from api.protocol.structured_outputs import StructuredOutputs
from api.protocol.tokenization import DetokenizeRequest, DetokenizeResponse, TokenizeRequest, TokenizeResponse

__all__ = [
    "AssistantMessage",
    "ChatCompletion",
    "ChatCompletionChoice",
    "ChatCompletionChunk",
    "ChatCompletionChunkChoice",
    "ChatCompletionMessage",
    "ChatCompletionRequest",
    "ChatMessage",
    "ChatTokenLogprob",
    "ChoiceLogprobs",
    "Completion",
    "CompletionChoice",
    "CompletionLogprobs",
    "CompletionRequest",
    "ContentPart",
    "DeltaFunctionCall",
    "DeltaMessage",
    "DeltaToolCall",
    "DetokenizeRequest",
    "DetokenizeResponse",
    "DeveloperMessage",
    "ErrorInfo",
    "ErrorResponse",
    "FunctionCall",
    "FunctionDefinition",
    "InputItem",
    "InputItemList",
    "ModelCard",
    "ModelList",
    "NamedToolChoice",
    "PromptTokensDetails",
    "ResponseDeleted",
    "ResponseFormatJsonObject",
    "ResponseFormatJsonSchema",
    "ResponseFormatText",
    "ResponseObject",
    "ResponseUsage",
    "ResponsesRequest",
    "StreamEvent",
    "StreamOptions",
    "StructuredOutputs",
    "SystemMessage",
    "TokenizeRequest",
    "TokenizeResponse",
    "Tool",
    "ToolCall",
    "ToolMessage",
    "TopLogprob",
    "Usage",
    "UserMessage",
]
