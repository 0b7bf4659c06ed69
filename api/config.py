"""The api's frozen configuration, built by `api/cli/serve.py`."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """What the HTTP server needs.

    served_model_names: names clients may send as `model`; the first one is reported in responses.
        Empty means the engine's own `model_name`.
    model_aliases: extra names accepted for the base model (not listed by /v1/models); "default"
        lets clients written against a generic OpenAI-compatible server work unchanged.
    api_key: when set, /v1/* needs `Authorization: Bearer <api_key>`.
    protect_metrics: /metrics needs the api key too (/health always stays open); raises ValueError
        without an api_key.
    allowed_origins, allowed_methods, allowed_headers, allow_credentials: CORS (starlette's
        CORSMiddleware), installed only when `allowed_origins` is non-empty; "*" allows any.
    chat_template: template text that replaces the tokenizer's own (the CLI reads a path into text).
    sse_ping_interval_s: seconds between SSE keep-alive comments (`: ping`); 0 disables them.
    tool_call_parser: the tool-call format of the served model (a `toolparsers.TOOL_PARSERS` name).
    enable_auto_tool_choice: allow tool_choice "auto" (the default whenever a request has tools);
        False answers it with 400, as vLLM does without --enable-auto-tool-choice.
    constrain_auto_tools: with tool_choice "auto", constrain calls (once the format's start marker
        appears) to the tools' names and schemas; False only parses what the model writes.
    close_tool_calls: when max_tokens is about to cut a constrained tool call, end the call with the
        shortest completion its grammar accepts (`engine.request.EngineRequest.close_grammar`), so
        every call returned validates; False lets max_tokens cut it (the cut call is dropped).
    close_structured_outputs: the same for `response_format` / `structured_outputs` outputs; off by
        default, since OpenAI returns the cut text with finish_reason "length".
    responses_db: where stored /v1/responses objects live: a SQLite file (its folder is created;
        ":memory:" keeps them for the life of the process) or a `postgresql://` URI (a PostgreSQL
        database several servers share). The CLI default is `data/responses.sqlite3`.
    responses_retention_s: stored responses older than this many seconds are removed; None keeps
        them. Raises ValueError when not positive.
    server_name: the stable name under which this server owns background responses in the store
        (`api/responses/store/interface.py` ServerIdentity); None means `<hostname>:<port>`.
        Servers sharing a store and a host:port (replicas behind one endpoint) each need their own.
    response_id_prefix: how every /v1/responses id starts; an engine replica of
        `--data-parallel-size` writes its rank into it (`api/replicas/response_owner.py`), which is
        how the request router finds the replica owning a stored response.
    allow_runtime_lora: serve POST /v1/load_lora_adapter and /v1/unload_lora_adapter.
    shutdown_grace_s: seconds running requests get to finish after SIGTERM before they are aborted
        (`api/http/shutdown.py`); raises ValueError when negative.
    keep_alive_s: seconds an idle HTTP/1.1 connection stays open. It must outlast the clients' own
        idle expiry (httpx, and so the openai and anthropic SDKs, reuse a connection for 5 s):
        a server that closes first races a client sending on it, which then sees "Server
        disconnected without sending a response". Raises ValueError when not positive.
    """

    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    protect_metrics: bool = False
    allowed_origins: tuple[str, ...] = ()
    allowed_methods: tuple[str, ...] = ("*",)
    allowed_headers: tuple[str, ...] = ("*",)
    allow_credentials: bool = False
    served_model_names: tuple[str, ...] = ()
    model_aliases: tuple[str, ...] = ("default",)
    chat_template: str | None = None
    log_level: str = "info"
    sse_ping_interval_s: float = 15.0
    tool_call_parser: str = "hermes"
    enable_auto_tool_choice: bool = True
    constrain_auto_tools: bool = True
    close_tool_calls: bool = True
    close_structured_outputs: bool = False
    responses_db: str = ":memory:"
    responses_retention_s: float | None = None
    server_name: str | None = None
    response_id_prefix: str = "resp_"
    allow_runtime_lora: bool = False
    shutdown_grace_s: float = 30.0
    keep_alive_s: float = 65.0

    def __post_init__(self) -> None:
        if self.responses_retention_s is not None and self.responses_retention_s <= 0:
            raise ValueError(f"--responses-retention must be positive, not {self.responses_retention_s:g} s")
        if self.shutdown_grace_s < 0:
            raise ValueError(f"--shutdown-grace must be >= 0, not {self.shutdown_grace_s:g}")
        if self.keep_alive_s <= 0:
            raise ValueError(f"--timeout-keep-alive must be positive, not {self.keep_alive_s:g}")
        if self.protect_metrics and not self.api_key:
            raise ValueError("--protect-metrics needs an API key (--api-key or STRUCTSERVE_API_KEY)")
