"""The access flags of `structserve serve`: --protect-metrics and CORS (vLLM's names, off by default)."""

from __future__ import annotations

import argparse
import json
from typing import Any


def parse_list(text: str) -> tuple[str, ...]:
    """A flag's list value: a JSON array of strings as vLLM takes it ('["https://a.example"]'), or
    comma-separated items ("https://a.example,https://b.example"). Raises argparse.ArgumentTypeError."""
    if text.lstrip().startswith("["):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise argparse.ArgumentTypeError(f"invalid JSON list {text!r}: {exc}") from None
        if not isinstance(data, list) or not all(isinstance(item, str) for item in data):
            raise argparse.ArgumentTypeError(f"expected a JSON list of strings, got {text!r}")
        return tuple(data)
    return tuple(item.strip() for item in text.split(",") if item.strip())


def add_access_arguments(parser: argparse.ArgumentParser) -> None:
    """Add --protect-metrics, --allowed-origins, --allowed-methods, --allowed-headers and
    --allow-credentials to the `serve` parser."""
    parser.add_argument(
        "--protect-metrics", action="store_true",
        help="require the API key on /metrics too (/health stays open); needs --api-key",
    )
    parser.add_argument(
        "--allowed-origins", type=parse_list, default=(),
        help='CORS origins, JSON list or comma-separated ("*" = any); CORS is off unless given',
    )
    parser.add_argument(
        "--allowed-methods", type=parse_list, default=("*",), help="CORS methods (default: all)"
    )
    parser.add_argument(
        "--allowed-headers", type=parse_list, default=("*",), help="CORS request headers (default: all)"
    )
    parser.add_argument(
        "--allow-credentials", action="store_true", help="CORS: allow cookies and Authorization headers"
    )


def access_options_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The ServerConfig fields of the access flags, by name."""
    return {
        "protect_metrics": args.protect_metrics,
        "allowed_origins": tuple(args.allowed_origins),
        "allowed_methods": tuple(args.allowed_methods),
        "allowed_headers": tuple(args.allowed_headers),
        "allow_credentials": args.allow_credentials,
    }
