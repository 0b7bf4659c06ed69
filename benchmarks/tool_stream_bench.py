#!/usr/bin/env python3
"""Issue 14 benchmark (not a test): tool-call TTFT against json_schema TTFT, before and after streaming
the arguments as generated.

For each checkout (`--before REV`, extracted with `git archive` into a temporary folder, and this
working tree), starts `structserve serve` (SmolLM2, model name smollm2) and runs the shared loadgen's
`tools` (tool_choice required) and `json_schema` loads at concurrency 1 and 8, alternating, each
`--repeats` times (medians). The loadgen's TTFT of a tools request is its first delta carrying a tool
call; a probe also times the first delta carrying an argument fragment (non-empty
`function.arguments`), which is what a client rendering the call waits for. A tools prompt is about
5x longer than a json_schema one (the tools' definitions), so json_schema also runs with its prompt
padded to the same length (`--prompt-tokens`). Prints ONE JSON line:
per checkout and load the TTFT p50 (ms), output tok/s and validity, the probe's time to the first
argument fragment p50, and the ratios the issue targets (tools TTFT / json_schema TTFT <= 1.3 at
the same concurrency; tools throughput after / before within +-5%). Loopback only, bounded loads.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
from run_bench import ROOT, import_loadgen, run_load
from server_process import start_server, stop_servers

LOADS = {
    "tools_c1": ["--mode", "tools", "--tool-choice", "required", "--concurrency", "1", "--requests", "6"],
    "json_schema_c1": ["--mode", "json_schema", "--concurrency", "1", "--requests", "6"],
    "tools_c8": ["--mode", "tools", "--tool-choice", "required", "--concurrency", "8", "--requests", "16"],
    "json_schema_c8": ["--mode", "json_schema", "--concurrency", "8", "--requests", "16"],
    # the same json_schema requests with a prompt as long as a tools prompt (about 320 tokens: the
    # tools' definitions are in the system prompt), so that prefill is the same on both sides
    "json_schema_long_c1": ["--mode", "json_schema", "--concurrency", "1", "--requests", "6",
                            "--prompt-tokens", "260"],
    "json_schema_long_c8": ["--mode", "json_schema", "--concurrency", "8", "--requests", "16",
                            "--prompt-tokens", "260"],
}


async def first_fragment_s(base_url: str, loadgen, concurrency: int, requests: int, max_tokens: int) -> list[float]:
    """Seconds from sending to the first SSE delta with a non-empty tool-call arguments fragment, per
    request (the loadgen's tools requests, tool_choice required). Each stream is read to its end, as
    the loadgen reads it: a probe that hung up at the fragment left the server decoding the aborted
    request while the next one arrived (about 40 ms more at c=1 in both checkouts)."""
    args = loadgen.parse_args(["--base-url", base_url + "/v1", "--model", "smollm2", "--mode", "tools",
                               "--tool-choice", "required", "--stream", "--max-tokens", str(max_tokens)])
    gate = asyncio.Semaphore(concurrency)

    async def one(client: httpx.AsyncClient, i: int) -> float:
        body, _ = loadgen.build_request(i, args)
        first: float | None = None
        async with gate:
            started = time.monotonic()
            async with client.stream("POST", base_url + "/v1/chat/completions", json=body) as response:
                async for line in response.aiter_lines():
                    if first is not None or not line.startswith("data: {"):   # found: drain the rest
                        continue
                    for choice in json.loads(line[6:]).get("choices", []):
                        for call in choice.get("delta", {}).get("tool_calls") or []:
                            if (call.get("function") or {}).get("arguments") and first is None:
                                first = time.monotonic() - started
        return first if first is not None else float("nan")

    async with httpx.AsyncClient(timeout=300) as client:
        return list(await asyncio.gather(*(one(client, i) for i in range(requests))))


def measure(roots: dict[str, Path], bench_dir: Path, repeats: int, max_tokens: int,
            server_args: list[str]) -> dict[str, dict]:
    """The loads and the probe against one server per checkout (label -> root), all started at
    once and measured alternately (each load runs on every server before the next load)."""
    loadgen = import_loadgen(bench_dir)
    with tempfile.TemporaryDirectory() as tmp:
        servers = {}
        try:
            for label, root in roots.items():
                servers[label] = start_server(["--served-model-name", "smollm2", *server_args],
                                              log_path=Path(tmp) / f"{label}.log", timeout_s=300.0, poll_s=1.0,
                                              cwd=root)
            for server in servers.values():   # a checkout that compiles its decode step: past it
                server.wait_for_compile()
            runs = {label: {name: [] for name in LOADS} for label in roots}
            probe = {label: {"c1": [], "c8": []} for label in roots}
            for label, server in servers.items():   # warm-up: grammar compiles, first touch of KV pages
                for name in ("tools_c1", "json_schema_c1"):
                    run_load(bench_dir, server.url, "smollm2", [*LOADS[name][:-1], "2", "--max-tokens", "32"], "warm")
            for repeat in range(repeats):
                for name, load in LOADS.items():
                    for label, server in servers.items():
                        runs[label][name].append(run_load(bench_dir, server.url, "smollm2",
                                                          [*load, "--max-tokens", str(max_tokens)], f"{repeat}"))
                for label, server in servers.items():
                    probe[label]["c1"] += asyncio.run(first_fragment_s(server.url, loadgen, 1, 4, max_tokens))
                    probe[label]["c8"] += asyncio.run(first_fragment_s(server.url, loadgen, 8, 8, max_tokens))
        finally:
            stop_servers(*servers.values(), timeout_s=60.0)
    return {label: _figures(runs[label], probe[label]) for label in roots}


def _figures(runs: dict[str, list[dict]], probe: dict[str, list[float]]) -> dict:
    figures: dict = {}
    for name, results in runs.items():
        figures[name] = {
            "ttft_p50_ms": statistics.median(r["ttft_p50_ms"] for r in results),
            "ttft_p50_runs": [r["ttft_p50_ms"] for r in results],
            "output_tok_s": statistics.median(r["output_tok_s"] for r in results),
            "valid_rate": statistics.median(r["valid_rate"] or 0.0 for r in results),
        }
    for key, seconds in probe.items():
        figures[f"first_fragment_{key}_p50_ms"] = round(1000 * statistics.median(seconds), 1)
    for c in ("c1", "c8"):
        tools, schema = figures[f"tools_{c}"], figures[f"json_schema_{c}"]
        figures[f"tools_over_json_schema_ttft_{c}"] = round(tools["ttft_p50_ms"] / schema["ttft_p50_ms"], 3)
        figures[f"first_fragment_over_json_schema_ttft_{c}"] = round(
            figures[f"first_fragment_{c}_p50_ms"] / schema["ttft_p50_ms"], 3)
        long_schema = figures[f"json_schema_long_{c}"]
        figures[f"tools_over_same_length_json_schema_ttft_{c}"] = round(
            tools["ttft_p50_ms"] / long_schema["ttft_p50_ms"], 3)
    return figures


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--bench-dir", default=str(ROOT.parent / "shared" / "bench"))
    p.add_argument("--before", default="", help="git revision to compare against (empty: this tree only)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--server-args", default="", help="extra flags for structserve serve")
    a = p.parse_args()
    bench_dir, server_args = Path(a.bench_dir), a.server_args.split()
    out: dict[str, object] = {"repeats": a.repeats, "max_tokens": a.max_tokens}
    with tempfile.TemporaryDirectory() as before_dir:
        roots = {"after": ROOT}
        if a.before:
            archive = subprocess.run(["git", "-C", str(ROOT), "archive", a.before], capture_output=True, check=True)
            subprocess.run(["tar", "-x", "-C", before_dir], input=archive.stdout, check=True)
            roots = {"before": Path(before_dir), **roots}
        out.update(measure(roots, bench_dir, a.repeats, a.max_tokens, server_args))
    if "before" in out:
        for c in ("c1", "c8"):
            out[f"tools_tok_s_after_over_before_{c}"] = round(
                out["after"][f"tools_{c}"]["output_tok_s"] / out["before"][f"tools_{c}"]["output_tok_s"], 3)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
