#!/usr/bin/env python3
"""Issue 14 benchmark (not a test): tool-call TTFT against json_schema TTFT, before and after streaming
the arguments as generated.

For each checkout (`--before REV`, extracted with `git archive` into a temporary folder, and this
working tree), starts `structserve serve` (SmolLM2, model name smollm2) and runs the shared loadgen's
`tools` (tool_choice required) and `json_schema` loads at concurrency 1 and 8, alternating, each
`--repeats` times (medians) after one warm-up pass of every load. `--prefix-cache` sets what each
run finds in the prefix cache: "shared" (default) gives the run its own `cache_salt` and first
sends one unmeasured request with the run's shared part (system prompt, tools, padding) and another
question, the steady state of an agent's traffic (the tools' prefix cached, each question new);
"cold" only salts the run, as a fresh server meets it (the 8 first requests at c=8 arrive together
and wait for one of them to prefill the tools' prefix); "all" sends no salt, so a run finds the
same load's previous prompts cached whole. The loadgen's TTFT of a
tools request is its first delta carrying a tool call; a probe also times the first delta carrying an argument fragment (non-empty
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


PREFIX_CACHE_MODES = ("shared", "cold", "all")
WARM_QUESTION = "Say hello."


def _salted(salt: str | None) -> list[str]:
    """Loadgen flags giving every request of a run the `cache_salt` `salt` (None: none): requests
    share prefix-cache blocks only within their run."""
    return ["--extra-body", json.dumps({"cache_salt": salt})] if salt is not None else []


def _warm_shared_prefix(base_url: str, loadgen, load: list[str], salt: str) -> None:
    """Send `load`'s first request with its question replaced by WARM_QUESTION, salted `salt`,
    max_tokens 16, unmeasured: the prefix cache then holds what the run's requests share (the
    template's head, the tools' definitions, the padding) and none of their questions. (With
    max_tokens 1 a forced call would end before its prefill: its first 8 tokens are forced.)"""
    args = loadgen.parse_args(["--model", "smollm2", *load, *_salted(salt)])
    body, _ = loadgen.build_request(0, args)
    question = (loadgen.TOOL_QUESTIONS if args.mode == "tools" else loadgen.QUESTIONS)[0]
    content = body["messages"][-1]["content"]
    assert question in content, "the loadgen's request layout changed"
    body["messages"][-1]["content"] = content.replace(question, WARM_QUESTION)
    body.update(stream=False, max_tokens=16)
    body.pop("stream_options", None)
    httpx.post(base_url + "/v1/chat/completions", json=body, timeout=300).raise_for_status()


def _run_salt(prefix_cache: str, run: str) -> str | None:
    """The cache_salt of the run named `run` under `prefix_cache` (None for "all")."""
    return None if prefix_cache == "all" else run


async def first_fragment_s(base_url: str, loadgen, concurrency: int, requests: int, max_tokens: int,
                           salt: str | None) -> list[float]:
    """Seconds from sending to the first SSE delta with a non-empty tool-call arguments fragment, per
    request (the loadgen's tools requests, tool_choice required). Each stream is read to its end, as
    the loadgen reads it: a probe that hung up at the fragment left the server decoding the aborted
    request while the next one arrived (about 40 ms more at c=1 in both checkouts)."""
    args = loadgen.parse_args(["--base-url", base_url + "/v1", "--model", "smollm2", "--mode", "tools",
                               "--tool-choice", "required", "--stream", "--max-tokens", str(max_tokens),
                               *_salted(salt)])
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
            server_args: list[str], prefix_cache: str) -> dict[str, dict]:
    """The loads and the probe against one server per checkout (label -> root), all started at
    once and measured alternately (each load runs on every server before the next load)."""
    loadgen = import_loadgen(bench_dir)
    probe_load = ["--mode", "tools", "--tool-choice", "required"]

    def prepare_run(url: str, load: list[str], run: str) -> str | None:
        salt = _run_salt(prefix_cache, run)
        if prefix_cache == "shared":
            _warm_shared_prefix(url, loadgen, load, run)
        return salt

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
            # warm-up, one pass of every load: grammar compiles, each step shape's first run, first
            # touch of KV pages (a first pass measured 1.5-2x slower than the next at c=1)
            for label, server in servers.items():
                for name, load in LOADS.items():
                    run_load(bench_dir, server.url, "smollm2", [*load, *_salted(_run_salt(prefix_cache, "warm")),
                                                                "--max-tokens", str(max_tokens)], "warm")
            for repeat in range(repeats):
                for name, load in LOADS.items():
                    for label, server in servers.items():
                        salt = prepare_run(server.url, load, f"{repeat}-{name}")
                        runs[label][name].append(run_load(bench_dir, server.url, "smollm2",
                                                          [*load, *_salted(salt), "--max-tokens",
                                                           str(max_tokens)], f"{repeat}"))
                for label, server in servers.items():
                    for c, concurrency, requests in (("c1", 1, 4), ("c8", 8, 8)):
                        salt = prepare_run(server.url, probe_load, f"{repeat}-probe-{c}")
                        probe[label][c] += asyncio.run(first_fragment_s(server.url, loadgen, concurrency, requests,
                                                                        max_tokens, salt))
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
    p.add_argument("--prefix-cache", choices=PREFIX_CACHE_MODES, default="shared",
                   help="what each run finds cached (see the module docstring)")
    a = p.parse_args()
    bench_dir, server_args = Path(a.bench_dir), a.server_args.split()
    out: dict[str, object] = {"repeats": a.repeats, "max_tokens": a.max_tokens, "prefix_cache": a.prefix_cache}
    with tempfile.TemporaryDirectory() as before_dir:
        roots = {"after": ROOT}
        if a.before:
            archive = subprocess.run(["git", "-C", str(ROOT), "archive", a.before], capture_output=True, check=True)
            subprocess.run(["tar", "-x", "-C", before_dir], input=archive.stdout, check=True)
            roots = {"before": Path(before_dir), **roots}
        out.update(measure(roots, bench_dir, a.repeats, a.max_tokens, server_args, a.prefix_cache))
    if "before" in out:
        for c in ("c1", "c8"):
            out[f"tools_tok_s_after_over_before_{c}"] = round(
                out["after"][f"tools_{c}"]["output_tok_s"] / out["before"][f"tools_{c}"]["output_tok_s"], 3)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
