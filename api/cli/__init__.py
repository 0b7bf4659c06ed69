"""The `structserve` command line: `structserve serve` (api/cli/serve.py), its access flags
(api/cli/access.py) and LoRA flags (api/cli/lora_flags.py). `python -m api.cli serve ...` runs it."""

from api.cli.serve import build_configs, build_parser, main, parse_size, read_chat_template, serve

__all__ = ["build_configs", "build_parser", "main", "parse_size", "read_chat_template", "serve"]
