#!/usr/bin/env python3
"""What a grammar costs in throughput: the loadgen's json_schema load against a plain load matched
to it request by request (issue 3's json/plain figure).

The shared loadgen's json_schema and plain modes are unlike loads: plain forces 128 tokens per
request while a JSON answer stops when its object closes (about 65 tokens on SmolLM2), so a batch
runs part-empty at the tail and the ratio of their tok/s mostly measures that. Here each round runs
the json_schema load (loadgen's own requests, validation and counting: `one_request`), then the
same requests without the grammar (`response_format` text) with `ignore_eos` and exactly the output
length each JSON answer had, at the same concurrency. The prompts and token counts are the same; only
the grammar differs. `--repeats` rounds, medians; prints ONE JSON line. Loopback only.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from run_bench import add_load_arguments, import_loadgen, served


async def drive(loadgen, url: str, args_for: Callable[[int], argparse.Namespace], requests: int,
                concurrency: int) -> tuple[list, float]:
    """Run loadgen.one_request for 0..requests-1 with `concurrency` workers; (results, wall seconds)."""
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(requests):
        queue.put_nowait(i)
    results: list = [None] * requests
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(limits=limits, timeout=600, trust_env=False) as client:
        async def worker() -> None:
            while not queue.empty():
                i = queue.get_nowait()
                results[i] = await loadgen.one_request(client, url, i, args_for(i))

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return results, time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    add_load_arguments(p)
    a = p.parse_args()
    loadgen = import_loadgen(Path(a.bench_dir))
    rounds = []
    with served(a.server_args.split()) as server:
        base_url = server.base_url
        json_args = loadgen.parse_args(["--base-url", base_url + "/v1", "--model", "smollm2", "--mode",
                                        "json_schema", "--stream", "--max-tokens", str(a.max_tokens)])
        url = base_url + "/v1/chat/completions"
        asyncio.run(drive(loadgen, url, lambda i: json_args, 3, 3))     # compile the three schemas once
        for _ in range(a.repeats):
            constrained, json_wall = asyncio.run(drive(loadgen, url, lambda i: json_args, a.requests, a.concurrency))
            lengths = [r.output_tokens for r in constrained]

            def plain_args(i: int) -> argparse.Namespace:
                args = copy.copy(json_args)
                args.extra_body = {"response_format": {"type": "text"}, "max_tokens": lengths[i],
                                   "min_tokens": lengths[i], "ignore_eos": True}
                return args

            matched, plain_wall = asyncio.run(drive(loadgen, url, plain_args, a.requests, a.concurrency))
            assert [r.output_tokens for r in matched] == lengths, "the matched plain load must have the same lengths"
            tokens = sum(lengths)
            rounds.append({"json_tok_s": tokens / json_wall, "plain_tok_s": tokens / plain_wall,
                           "valid": sum(bool(r.valid) for r in constrained), "output_tokens": tokens,
                           "finish_reasons": sorted(r.finish_reason or "" for r in constrained)})
            print(json.dumps(rounds[-1]), file=sys.stderr, flush=True)
    json_tok_s = statistics.median(r["json_tok_s"] for r in rounds)
    plain_tok_s = statistics.median(r["plain_tok_s"] for r in rounds)
    print(json.dumps({
        "concurrency": a.concurrency, "requests": a.requests, "repeats": a.repeats, "server_args": a.server_args,
        "json_schema_tok_s": round(json_tok_s, 2), "matched_plain_tok_s": round(plain_tok_s, 2),
        "json_over_matched_plain": round(statistics.median(r["json_tok_s"] / r["plain_tok_s"] for r in rounds), 3),
        "runs": [{k: (round(v, 2) if isinstance(v, float) else v) for k, v in r.items()} for r in rounds],
    }))


if __name__ == "__main__":
    main()
