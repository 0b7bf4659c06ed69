#!/usr/bin/env python3
"""`--data-parallel-size 2`: structserve's request router against Serve's default router (issue 16).

Starts servers on free loopback ports, each 2 SmolLM2 replicas of one torch thread: one with
`--request-router structserve` per `--thresholds` value (its `--router-imbalance-threshold`), one
with `--request-router default` (Ray Serve's power of two choices). After a warm-up (a few short
unrelated requests to each), `--rounds` rounds; each round measures every server one after the
other, rotating which goes first, so none always runs on the busier box. Every round uses `--prompts` system prompts of about 1,000 tokens that no
earlier round used (the round number is in their first words), so each round starts on cold prefix
caches, as a fresh server would. The load: `--requests` streamed chat requests, each with one of
the prompts and its own question, at `--concurrency`, `--max-tokens` output tokens, temperature 0.
`--order cyclic`: request i uses prompt i % P; `shuffled`: each prompt equally often (to within one),
in an order drawn per round (seeded by the round), the same for both routers.

Two configurations (README, "More than one engine"):
- the issue's: 4 prompts, 32 requests, concurrency 8, `--kv-cache-memory 512MiB` per replica
  (11,648 tokens: every prompt fits in each replica's cache, so both routers hit once a replica has
  seen a prompt, and the p50 falls among those warm requests);
- memory-bound: `--prompts 8 --requests 64 --order shuffled --kv-cache-memory 224MiB`: each
  replica's cache holds about 5,000 tokens, about 0.65 of the 8 prompts' working set, the case
  cache-aware routing is for (hot prefixes outnumber what one cache holds). A router that keeps
  each prompt on one replica needs half the set per replica; one that spreads them cycles every
  prompt through every cache.

Per router and round: the prefix-cache hit rate (cached prompt tokens / prompt tokens, from each
answer's usage), TTFT p50, p90 and mean (ms) and the two ceilings of `prefix_ceiling.py` (the best any router
can do on this load, and the best the engine could do given where this router sent each request).
Reports medians over the rounds and, for each server of ours, the ratios ours / default of the
medians; each round's summary carries the 1-minute load average at its end. `--dump` writes
every request (order, prompt, replica, start, TTFT, cached and prompt tokens) as JSON lines.
Prints ONE JSON line. Traffic goes only to 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import TextIO

import httpx

from prefix_ceiling import ceiling_given_routing, ideal_ceiling
from server_process import ServerProcess, start_server, stop_servers

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from api.cli.serve import parse_size  # noqa: E402  (the server's own reading of --kv-cache-memory)

TOPICS = ("astronomy", "cooking", "tax law", "sailing", "chess", "gardening", "plumbing", "opera",
          "beekeeping", "cycling", "pottery", "geology", "knitting", "photography", "falconry", "welding")
DEFAULT = "default"   # Serve's power of two choices: the baseline every other server is compared with
BLOCK_SIZE = 16   # the engine's default block size: prefix hits are whole blocks
# SmolLM2-135M's K and V per token in the CPU engine's float32 cache: 2 x 30 layers x 3 KV heads x 64 x 4 B
KV_BYTES_PER_TOKEN = 2 * 30 * 3 * 64 * 4


def system_prompt(topic: str, round_idx: int) -> str:
    """About 1,000 SmolLM2 tokens of rules about `topic`; its first words differ per topic and round."""
    rules = " ".join(f"Rule {i} for {topic}: answer questions on {topic} subtopic {i} briefly, "
                     f"politely and with one concrete example." for i in range(38))
    return f"Session {round_idx}. You are an expert assistant on {topic}. {rules}"


def messages(system: str, question: str) -> list[dict]:
    return [{"role": "system", "content": system}, {"role": "user", "content": question}]


async def one(client: httpx.AsyncClient, msgs: list[dict], max_tokens: int, t0: float) -> dict:
    """Start (s after `t0`), TTFT (s), prompt and cached tokens and the serving replica of one
    streamed chat request."""
    body = {"model": "smollm2", "messages": msgs, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    start = time.perf_counter()
    ttft, usage = None, {}
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        replica = response.headers.get("x-structserve-replica")
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if ttft is None and chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
                ttft = time.perf_counter() - start
            usage = chunk.get("usage") or usage
    details = usage.get("prompt_tokens_details") or {}
    return {"start_s": start - t0, "ttft_s": ttft, "prompt_tokens": usage.get("prompt_tokens", 0),
            "cached_tokens": details.get("cached_tokens") or 0, "replica": replica}


async def run_load(base_url: str, bodies: list[list[dict]], plan: list[int], concurrency: int,
                   max_tokens: int) -> list[dict]:
    """Send `bodies` (in order, `concurrency` at a time, `max_tokens` each; `plan[i]`: the prompt
    index of body i, for the records); one record per request, in request order."""
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(len(bodies)):
        queue.put_nowait(i)
    results: dict[int, dict] = {}
    t0 = time.perf_counter()
    async with httpx.AsyncClient(base_url=base_url, timeout=600, trust_env=False,
                                 limits=httpx.Limits(max_connections=concurrency)) as client:
        async def worker() -> None:
            while not queue.empty():
                i = queue.get_nowait()
                results[i] = {"i": i, "prompt": plan[i], **await one(client, bodies[i], max_tokens, t0)}

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return [results[i] for i in range(len(bodies))]


def token_ids(base_url: str, bodies: list[list[dict]]) -> list[list[int]]:
    """The prompt token ids of each chat body (POST /tokenize renders the chat template as chat does)."""
    with httpx.Client(base_url=base_url, timeout=60, trust_env=False) as client:
        return [client.post("/tokenize", json={"model": "smollm2", "messages": msgs}).json()["tokens"]
                for msgs in bodies]


def summarize(records: list[dict], ids: list[list[int]]) -> dict:
    """Hit rate, its two ceilings, TTFT p50 and requests per replica of one measured round
    (`ids`: each request's prompt token ids)."""
    prompt_tokens = sum(r["prompt_tokens"] for r in records)
    ttfts = sorted(r["ttft_s"] for r in records if r["ttft_s"] is not None)
    replicas = [r["replica"] for r in records]
    return {"hit_rate": sum(r["cached_tokens"] for r in records) / prompt_tokens,
            "ceiling_given_routing": ceiling_given_routing(ids, replicas, BLOCK_SIZE) / prompt_tokens,
            "ideal_ceiling": ideal_ceiling(ids, BLOCK_SIZE) / prompt_tokens,
            "ttft_p50_ms": 1000 * statistics.median(ttfts), "ttft_p90_ms": 1000 * ttfts[int(0.9 * len(ttfts))],
            "ttft_mean_ms": 1000 * statistics.fmean(ttfts),
            "requests_per_replica": {k: replicas.count(k) for k in sorted(set(replicas), key=str)}}


def warm_up(server: ServerProcess) -> None:
    """A few short unrelated requests, concurrently, so that both replicas have run a forward."""
    bodies = [messages(f"Warm-up {i}.", "Say hi.") for i in range(4)]
    asyncio.run(run_load(server.url, bodies, [0] * len(bodies), 4, 2))


def routers(thresholds: list[int]) -> dict[str, list[str]]:
    """Label -> router flags of each server: ours at each imbalance threshold ("structserve", or
    "structserve@T" when several are compared), then Serve's default."""
    ours = {("structserve" if len(thresholds) == 1 else f"structserve@{t}"):
            ["--request-router", "structserve", "--router-imbalance-threshold", str(t)] for t in thresholds}
    return {**ours, DEFAULT: ["--request-router", "default"]}


def start(router_flags: list[str], kv_cache_memory: int) -> tuple[ServerProcess, float]:
    """The server with `router_flags` and `kv_cache_memory` per replica, warmed up, and its start-up
    time (process start to /health 200, s)."""
    started = time.perf_counter()
    server = start_server(["--data-parallel-size", "2", *router_flags, "--num-threads", "1",
                           "--served-model-name", "smollm2", "--kv-cache-memory", str(kv_cache_memory),
                           "--max-model-len", "4096", "--no-compile", "--responses-db", ":memory:"], timeout_s=600)
    startup_s = time.perf_counter() - started
    warm_up(server)
    return server, startup_s


def measure_round(servers: dict[str, ServerProcess], round_idx: int, a: argparse.Namespace,
                  dump: TextIO | None) -> dict[str, dict]:
    """One round on fresh prompts: each server in turn (the order rotates by round), label -> summary."""
    prompts = [system_prompt(topic, round_idx) for topic in TOPICS[:a.prompts]]
    plan = prompt_plan(a.requests, a.prompts, a.order, round_idx)
    bodies = [messages(prompts[p], f"Question {i}: give one tip.") for i, p in enumerate(plan)]
    labels = list(servers)
    ids = token_ids(servers[labels[0]].url, bodies)
    summaries = {}
    shift = round_idx % len(labels)
    for router in labels[shift:] + labels[:shift]:
        records = asyncio.run(run_load(servers[router].url, bodies, plan, a.concurrency, a.max_tokens))
        summaries[router] = {**summarize(records, ids), "load_avg_1m": os.getloadavg()[0]}
        for record in records if dump is not None else ():
            dump.write(json.dumps({"router": router, "round": round_idx, **record}) + "\n")
    return summaries


def prompt_plan(num_requests: int, num_prompts: int, order: str, round_idx: int) -> list[int]:
    """The prompt index of each request: cyclic (i % P) or each prompt equally often (to within
    one) in an order shuffled with seed `round_idx`."""
    plan = [i % num_prompts for i in range(num_requests)]
    if order == "shuffled":
        random.Random(round_idx).shuffle(plan)
    return plan


def working_set(a: argparse.Namespace, base_url: str) -> dict:
    """The load's distinct prompt tokens against one replica's KV cache (tokens; whole blocks)."""
    bodies = [messages(system_prompt(topic, 0), "Question 0: give one tip.") for topic in TOPICS[:a.prompts]]
    prompt_tokens = sum(len(ids) for ids in token_ids(base_url, bodies))
    kv_tokens = a.kv_cache_memory // (BLOCK_SIZE * KV_BYTES_PER_TOKEN) * BLOCK_SIZE
    return {"prompts": a.prompts, "working_set_tokens": prompt_tokens, "kv_cache_tokens_per_replica": kv_tokens,
            "kv_cache_over_working_set": kv_tokens / prompt_tokens}


def report(rounds: dict[str, list[dict]], startup_s: dict[str, float]) -> dict:
    """Per server the medians over the rounds, then for each of ours (`ratios[label]`) the ratios
    ours / default of those medians."""
    out: dict = {"startup_s": startup_s, "rounds": rounds, "ratios": {}}
    for router in rounds:
        out[router] = {key: statistics.median(r[key] for r in rounds[router])
                       for key in ("hit_rate", "ceiling_given_routing", "ideal_ceiling", "ttft_p50_ms",
                                   "ttft_p90_ms", "ttft_mean_ms")}
    default = out[DEFAULT]
    for router in rounds:
        if router != DEFAULT:
            ours = out[router]
            out["ratios"][router] = {"hit_rate": ours["hit_rate"] / default["hit_rate"] if default["hit_rate"] else None,
                                     **{key.replace("_ms", ""): ours[key] / default[key]
                                        for key in ("ttft_p50_ms", "ttft_p90_ms", "ttft_mean_ms")}}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--prompts", type=int, default=4, help=f"distinct system prompts (at most {len(TOPICS)})")
    parser.add_argument("--order", choices=("cyclic", "shuffled"), default="cyclic")
    parser.add_argument("--kv-cache-memory", type=parse_size, default="512MiB",
                        help="each replica's --kv-cache-memory (e.g. 224MiB)")
    parser.add_argument("--thresholds", default="4",
                        help="comma-separated --router-imbalance-threshold values: one server of ours each")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dump", default=None, help="write every request record as JSON lines to this file")
    a = parser.parse_args()
    if not 1 <= a.prompts <= len(TOPICS):
        parser.error(f"--prompts must be 1..{len(TOPICS)}")
    flags = routers([int(t) for t in a.thresholds.split(",")])
    servers: dict[str, ServerProcess] = {}
    startup_s: dict[str, float] = {}
    rounds: dict[str, list[dict]] = {label: [] for label in flags}
    with contextlib.ExitStack() as stack:
        stack.callback(lambda: stop_servers(*servers.values()))
        dump = stack.enter_context(open(a.dump, "w")) if a.dump else None
        for label, router_flags in flags.items():
            servers[label], startup_s[label] = start(router_flags, a.kv_cache_memory)
        load = working_set(a, servers[DEFAULT].url)
        for round_idx in range(a.rounds):
            for router, summary in measure_round(servers, round_idx, a, dump).items():
                rounds[router].append(summary)
    print(json.dumps({"load": {**load, "requests": a.requests, "concurrency": a.concurrency, "order": a.order},
                      **report(rounds, startup_s)}))


if __name__ == "__main__":
    main()
