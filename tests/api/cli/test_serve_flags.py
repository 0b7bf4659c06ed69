"""api/cli/serve.py: flags -> EngineConfig and ServerConfig."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from api.cli.serve import build_configs, build_parser, main, parse_size, read_chat_template
from engine import ALL_ROWS


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("4096", 4096),
        ("2GiB", 2 * 2**30),
        ("512MiB", 512 * 2**20),
        ("1.5GB", 1_500_000_000),
        ("1e9", 10**9),
        ("64kib", 65536),
    ],
)
def test_parse_size(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "abc", "2XB", "-1GiB", "0"])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        parse_size(text)


def test_flags_build_both_configs(tmp_path: Path) -> None:
    template = tmp_path / "t.jinja"
    template.write_text("{{ messages }}")
    args = build_parser().parse_args(
        [
            "serve",
            "model.gguf",
            "--host",
            "0.0.0.0",
            "--port",
            "9000",
            "--served-model-name",
            "a",
            "b",
            "--max-model-len",
            "2048",
            "--max-num-seqs",
            "8",
            "--max-num-batched-tokens",
            "512",
            "--max-prefill-tokens-per-step",
            "96",
            "--block-size",
            "32",
            "--kv-cache-memory",
            "512MiB",
            "--dtype",
            "float32",
            "--quantization",
            "int8",
            "--seed",
            "3",
            "--no-enable-prefix-caching",
            "--chat-template",
            str(template),
            "--num-threads",
            "1",
            "--log-level",
            "debug",
        ]
    )
    engine_config, server_config = build_configs(args, {})
    assert (engine_config.model, engine_config.served_model_name, engine_config.max_model_len) == (
        "model.gguf",
        "a",
        2048,
    )
    assert (engine_config.max_num_seqs, engine_config.max_num_batched_tokens, engine_config.block_size) == (
        8,
        512,
        32,
    )
    assert engine_config.kv_cache_memory_bytes == 512 * 2**20 and engine_config.dtype == "float32"
    assert engine_config.max_prefill_tokens_per_step == 96
    assert engine_config.quantization == "int8"
    assert (
        engine_config.seed == 3 and not engine_config.enable_prefix_caching and engine_config.num_threads == 1
    )
    assert engine_config.chat_template == server_config.chat_template == "{{ messages }}"
    assert (server_config.host, server_config.port, server_config.served_model_names) == (
        "0.0.0.0",
        9000,
        ("a", "b"),
    )
    assert server_config.api_key is None and server_config.log_level == "debug"


def test_defaults_and_api_key_from_env() -> None:
    engine_config, server_config = build_configs(
        build_parser().parse_args(["serve"]), {"STRUCTSERVE_API_KEY": "k"}
    )
    assert engine_config.model is None and engine_config.enable_prefix_caching
    assert engine_config.quantization == "auto" and engine_config.num_threads is None   # the GGUF's own; all cores
    assert engine_config.max_prefill_tokens_per_step is None     # 64 on CPU, none on CUDA (the engine decides)
    assert (server_config.host, server_config.port, server_config.api_key) == ("127.0.0.1", 8000, "k")
    _, flagged = build_configs(
        build_parser().parse_args(["serve", "--api-key", "f"]), {"STRUCTSERVE_API_KEY": "k"}
    )
    assert flagged.api_key == "f"


def test_compile_cache_dir_flag_env_and_default(tmp_path: Path) -> None:
    """--compile-cache-dir, else TORCHINDUCTOR_CACHE_DIR, else structserve/inductor under the XDG
    cache folder; only when compiling (the default; an eager `--no-compile` server leaves inductor's
    setting alone)."""
    def cache_dir(argv: list[str], environ: dict[str, str]) -> str | None:
        return build_configs(build_parser().parse_args(["serve", *argv]), environ)[0].compile_cache_dir

    assert cache_dir(["--no-compile"], {"XDG_CACHE_HOME": str(tmp_path)}) is None
    assert build_configs(build_parser().parse_args(["serve"]), {})[0].compile_decode
    assert cache_dir([], {"XDG_CACHE_HOME": str(tmp_path)}) == str(tmp_path / "structserve" / "inductor")
    assert cache_dir(["--compile"], {"XDG_CACHE_HOME": str(tmp_path)}) == str(tmp_path / "structserve" / "inductor")
    assert cache_dir(["--compile"], {}) == str(Path.home() / ".cache" / "structserve" / "inductor")
    assert cache_dir(["--compile"], {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "t"),
                                     "XDG_CACHE_HOME": "/x"}) == str(tmp_path / "t")
    assert build_configs(build_parser().parse_args(["serve", "--crossover-rows", "8"]), {})[0].crossover_rows == 8
    assert build_configs(build_parser().parse_args(["serve", "--crossover-rows", "all"]), {})[0].crossover_rows == ALL_ROWS
    for bad in ("-1", "many"):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["serve", "--crossover-rows", bad])
    flagged = ["--compile", "--compile-cache-dir", str(tmp_path / "f")]
    assert cache_dir(flagged, {"TORCHINDUCTOR_CACHE_DIR": "/t"}) == str(tmp_path / "f")


def test_tool_flags() -> None:
    _, defaults = build_configs(build_parser().parse_args(["serve"]), {})
    assert defaults.tool_call_parser == "hermes"
    assert defaults.enable_auto_tool_choice and defaults.constrain_auto_tools
    assert defaults.close_tool_calls and not defaults.close_structured_outputs
    _, flagged = build_configs(
        build_parser().parse_args(
            [
                "serve",
                "--tool-call-parser",
                "mistral",
                "--no-enable-auto-tool-choice",
                "--no-constrain-auto-tools",
                "--no-close-tool-calls",
                "--close-structured-outputs",
                "--chat-template",
                "hermes_tools",
            ]
        ),
        {},
    )
    assert flagged.tool_call_parser == "mistral"
    assert not flagged.enable_auto_tool_choice and not flagged.constrain_auto_tools
    assert not flagged.close_tool_calls and flagged.close_structured_outputs
    assert flagged.chat_template is not None and "<tool_call>" in flagged.chat_template
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "--tool-call-parser", "nope"])
    assert exit_info.value.code == 2


def test_chat_template_inline_or_missing_file() -> None:
    assert read_chat_template("{% for m in messages %}{% endfor %}") == "{% for m in messages %}{% endfor %}"
    with pytest.raises(ValueError):
        read_chat_template("/no/such/template.jinja")


def test_invalid_config_exits_with_usage_error() -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "--block-size", "3"])
    assert exit_info.value.code == 2
