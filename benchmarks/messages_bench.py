#!/usr/bin/env python3
"""/v1/messages against /v1/chat/completions on the same load (issue 15's figure).

Starts `structserve serve` on a free loopback port and sends the shared loadgen's plain questions
(../shared/bench/loadgen.py QUESTIONS) to both endpoints: streaming, temperature 0, `--concurrency`
parallel clients, `--requests` requests of at most `--max-tokens` output tokens. Both endpoints
render the same chat prompt, so greedy answers (and token counts) are the same, which is checked;
the ratios show the cost of the Messages layer. Loads alternate chat/messages for `--repeats`
rounds; prints ONE JSON line: median output tok/s and TTFT p50 per endpoint and the ratios.
Chat is measured by `responses_bench.one`. Traffic goes only to 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

import httpx

from responses_bench import chat_body, one, run_requests
from run_bench import add_load_arguments, import_loadgen, served

CHAT, MESSAGES = "/v1/chat/completions", "/v1/messages"


def messages_body(question: str, max_tokens: int) -> dict:
    return {"model": "smollm2", "messages": [{"role": "user", "content": question}], "max_tokens": max_tokens,
            "temperature": 0.0, "stream": True}


async def one_message(client: httpx.AsyncClient, body: dict) -> tuple[float | None, int, str]:
    """(seconds to the first text delta, output tokens, text) of one streamed Messages request."""
    start = time.perf_counter()
    ttft, tokens, texts = None, 0, []
    async with client.stream("POST", MESSAGES, json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: "):
                continue
            event = json.loads(line[6:])
            if event["type"] == "content_block_delta" and event["delta"]["type"] == "text_delta":
                ttft = ttft if ttft is not None else time.perf_counter() - start
                texts.append(event["delta"]["text"])
            elif event["type"] == "message_delta":
                tokens = event["usage"]["output_tokens"]
    return ttft, tokens, "".join(texts)


async def run_load(base_url: str, endpoint: str, questions: list[str], a: argparse.Namespace) -> dict:
    """responses_bench.run_requests on chat or Messages (`endpoint`), same questions and max_tokens."""
    async def send(client: httpx.AsyncClient, question: str) -> tuple[float | None, int]:
        if endpoint == CHAT:
            return await one(client, CHAT, chat_body(question, a.max_tokens))
        return (await one_message(client, messages_body(question, a.max_tokens)))[:2]

    return await run_requests(base_url, send, questions, a)


async def same_answers(base_url: str, questions: list[str], max_tokens: int) -> bool:
    """Whether chat and Messages give the same greedy text for the first questions (one at a time)."""
    async with httpx.AsyncClient(base_url=base_url, timeout=600, trust_env=False) as client:
        for question in questions[:4]:
            body = {**chat_body(question, max_tokens), "stream": False}
            body.pop("stream_options")
            chat = (await client.post(CHAT, json=body)).json()["choices"][0]["message"]["content"]
            if (await one_message(client, messages_body(question, max_tokens)))[2] != chat:
                return False
    return True


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    add_load_arguments(p)
    a = p.parse_args()
    questions = list(import_loadgen(Path(a.bench_dir)).QUESTIONS)
    runs: dict[str, list[dict]] = {"chat": [], "messages": []}
    with served(a.server_args.split()) as base_url:
        same = asyncio.run(same_answers(base_url, questions, a.max_tokens))
        asyncio.run(run_load(base_url, CHAT, questions, a))     # warm-up
        for _ in range(a.repeats):
            runs["chat"].append(asyncio.run(run_load(base_url, CHAT, questions, a)))
            runs["messages"].append(asyncio.run(run_load(base_url, MESSAGES, questions, a)))
            print(json.dumps({k: v[-1] for k, v in runs.items()}), file=sys.stderr, flush=True)
    figures: dict[str, object] = {"concurrency": a.concurrency, "requests": a.requests, "repeats": a.repeats,
                                  "same_greedy_answers": same}
    medians = {}
    for name, entries in runs.items():
        medians[name] = (statistics.median(e["output_tok_s"] for e in entries),
                         statistics.median(e["ttft_p50_ms"] for e in entries))
        figures[name] = {"output_tok_s": round(medians[name][0], 2),
                         "runs": [round(e["output_tok_s"], 2) for e in entries],
                         "output_tokens": [e["output_tokens"] for e in entries],
                         "ttft_p50_ms": round(medians[name][1], 1)}
    figures["messages_over_chat_tok_s"] = round(medians["messages"][0] / medians["chat"][0], 3)
    figures["messages_over_chat_ttft"] = round(medians["messages"][1] / medians["chat"][1], 3)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
