"""The LoRA flags of `structserve serve` (vLLM's names) and the LoraConfig built from them."""

from __future__ import annotations

import argparse
import json

from lora.config import LoraConfig, LoraModuleSpec


def parse_lora_module(text: str) -> LoraModuleSpec:
    """One --lora-modules value: `name=path`, or JSON `{"name", "path", "base_model_name"?}`.
    Raises argparse.ArgumentTypeError on anything else."""
    if text.lstrip().startswith("{"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise argparse.ArgumentTypeError(f"--lora-modules: invalid JSON {text!r}: {exc}") from None
        if not isinstance(data, dict) or not isinstance(data.get("name"), str) or not isinstance(data.get("path"), str):
            raise argparse.ArgumentTypeError(f'--lora-modules: JSON needs string "name" and "path": {text!r}')
        unknown = sorted(set(data) - {"name", "path", "base_model_name"})
        if unknown:
            raise argparse.ArgumentTypeError(f"--lora-modules: unknown keys {unknown} in {text!r}")
        base = data.get("base_model_name")
        if base is not None and not isinstance(base, str):
            raise argparse.ArgumentTypeError(f'--lora-modules: "base_model_name" must be a string: {text!r}')
        return LoraModuleSpec(data["name"], data["path"], base)
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"--lora-modules: expected name=path or JSON, got {text!r}")
    return LoraModuleSpec(name, path)


def add_lora_arguments(parser: argparse.ArgumentParser) -> None:
    """Add --enable-lora, --lora-modules, --max-loras, --max-lora-rank, --max-cpu-loras and
    --allow-runtime-lora to the `serve` parser."""
    parser.add_argument("--enable-lora", action="store_true", help="serve LoRA adapters chosen by `model`")
    parser.add_argument(
        "--lora-modules", nargs="+", type=parse_lora_module, default=[], metavar="NAME=PATH",
        help='adapters to load at startup: name=path or \'{"name": ..., "path": ..., "base_model_name": ...}\'',
    )
    parser.add_argument("--max-loras", type=int, default=1, help="adapters resident in one batch at once")
    parser.add_argument("--max-lora-rank", type=int, default=16, help="largest adapter rank accepted")
    parser.add_argument(
        "--max-cpu-loras", type=int, default=None,
        help="adapters kept in host memory (LRU; others are re-read from disk); default: all",
    )
    parser.add_argument(
        "--allow-runtime-lora", action="store_true",
        help="enable POST /v1/load_lora_adapter and /v1/unload_lora_adapter (behind --api-key when set)",
    )


def lora_config_from_args(args: argparse.Namespace, served_names: tuple[str, ...]) -> LoraConfig | None:
    """The LoraConfig of the parsed flags, None without --enable-lora. Raises ValueError for LoRA
    flags without --enable-lora or an adapter named like the base model; InvalidLoraAdapter for
    out-of-range limits."""
    if not args.enable_lora:
        if args.lora_modules or args.allow_runtime_lora:
            raise ValueError("--lora-modules and --allow-runtime-lora need --enable-lora")
        return None
    taken = sorted({m.name for m in args.lora_modules} & ({*served_names, "default"}))
    if taken:
        raise ValueError(f"--lora-modules: {', '.join(taken)} is the base model's name")
    return LoraConfig(max_loras=args.max_loras, max_lora_rank=args.max_lora_rank,
                      max_cpu_loras=args.max_cpu_loras, modules=tuple(args.lora_modules))
