#!/usr/bin/env python3
"""/v1/responses against /v1/chat/completions on the same load (issue 5's figure).

Starts `structserve serve` on a free loopback port and sends the shared loadgen's plain questions
(../shared/bench/loadgen.py QUESTIONS) to both endpoints: streaming, temperature 0, `--concurrency`
parallel clients, `--requests` requests of at most `--max-tokens` output tokens. Both endpoints
render the same chat prompt, so greedy answers (and token counts) are the same; the ratio shows the
cost of the Responses layer (event building, storage). Loads alternate chat/responses for
`--repeats` rounds; prints ONE JSON line: median output tok/s and TTFT p50 per endpoint and the
ratio. Output tokens come from each stream's final usage. Traffic goes only to 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx

from run_bench import add_load_arguments, import_loadgen, served


def chat_body(question: str, max_tokens: int) -> dict:
    return {"model": "smollm2", "messages": [{"role": "user", "content": question}], "max_tokens": max_tokens,
            "temperature": 0.0, "stream": True, "stream_options": {"include_usage": True}}


def responses_body(question: str, max_tokens: int) -> dict:
    return {"model": "smollm2", "input": question, "max_output_tokens": max_tokens, "temperature": 0.0,
            "stream": True, "store": True}


async def one(client: httpx.AsyncClient, endpoint: str, body: dict) -> tuple[float | None, int]:
    """(seconds to the first text delta, output tokens) of one streamed request."""
    start = time.perf_counter()
    ttft, tokens = None, 0
    async with client.stream("POST", endpoint, json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if endpoint.endswith("/chat/completions"):
                if ttft is None and any(c["delta"].get("content") for c in event.get("choices", [])):
                    ttft = time.perf_counter() - start
                if event.get("usage"):
                    tokens = event["usage"]["completion_tokens"]
            else:
                if ttft is None and event["type"] == "response.output_text.delta":
                    ttft = time.perf_counter() - start
                if event["type"] in ("response.completed", "response.incomplete"):
                    tokens = event["response"]["usage"]["output_tokens"]
    return ttft, tokens


Send = Callable[[httpx.AsyncClient, str], Awaitable[tuple[float | None, int]]]


async def run_requests(base_url: str, send: Send, questions: list[str], a: argparse.Namespace) -> dict:
    """`a.requests` requests, `a.concurrency` at a time, each `send(client, question)` returning (TTFT
    seconds or None, output tokens), over the loadgen's questions in turn: output tok/s, tokens and
    TTFT p50 (ms)."""
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(a.requests):
        queue.put_nowait(i)
    results: list[tuple[float | None, int]] = []
    limits = httpx.Limits(max_connections=a.concurrency)
    async with httpx.AsyncClient(base_url=base_url, timeout=600, limits=limits, trust_env=False) as client:
        async def worker() -> None:
            while not queue.empty():
                results.append(await send(client, questions[queue.get_nowait() % len(questions)]))

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(a.concurrency)))
        wall = time.perf_counter() - start
    tokens = sum(t for _, t in results)
    ttfts = sorted(t for t, _ in results if t is not None)
    return {"output_tok_s": tokens / wall, "output_tokens": tokens,
            "ttft_p50_ms": 1000 * ttfts[len(ttfts) // 2] if ttfts else None}


async def run_load(base_url: str, endpoint: str, questions: list[str], a: argparse.Namespace) -> dict:
    """run_requests on chat or Responses (`endpoint`) with the same questions and max_tokens."""
    make = chat_body if endpoint == "/v1/chat/completions" else responses_body
    return await run_requests(base_url, lambda client, q: one(client, endpoint, make(q, a.max_tokens)), questions, a)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    add_load_arguments(p)
    a = p.parse_args()
    questions = list(import_loadgen(Path(a.bench_dir)).QUESTIONS)
    runs: dict[str, list[dict]] = {"chat": [], "responses": []}
    with served(["--responses-db", ":memory:", *a.server_args.split()]) as server:
        base_url = server.base_url
        asyncio.run(run_load(base_url, "/v1/chat/completions", questions, a))     # warm-up
        for _ in range(a.repeats):
            runs["chat"].append(asyncio.run(run_load(base_url, "/v1/chat/completions", questions, a)))
            runs["responses"].append(asyncio.run(run_load(base_url, "/v1/responses", questions, a)))
            print(json.dumps({k: v[-1] for k, v in runs.items()}), file=sys.stderr, flush=True)
    figures: dict[str, object] = {"concurrency": a.concurrency, "requests": a.requests, "repeats": a.repeats}
    for name, entries in runs.items():
        figures[name] = {"output_tok_s": round(statistics.median(e["output_tok_s"] for e in entries), 2),
                         "runs": [round(e["output_tok_s"], 2) for e in entries],
                         "output_tokens": [e["output_tokens"] for e in entries],
                         "ttft_p50_ms": round(statistics.median(e["ttft_p50_ms"] for e in entries), 1)}
    figures["responses_over_chat"] = round(figures["responses"]["output_tok_s"] / figures["chat"]["output_tok_s"], 3)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
