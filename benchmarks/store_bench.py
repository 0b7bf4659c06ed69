"""The Responses store on its two backends: put / get latency, and previous_response_id history
read in one recursive query (what the store does) against following the chain one `get` per
response (what the SQLite store did before). Not a test: figures only, one JSON line.

    python benchmarks/store_bench.py [--depths 10 100] [--rounds 5]

SQLite is a file in a temporary folder; PostgreSQL a throwaway server on loopback
(`benchmarks/postgres_process.py`), or `--postgres URL`. The two ways of reading history take
turns within each round; figures are medians over rounds, read them as ratios on a shared box.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from api.responses.store import (  # noqa: E402
    ResponsesStore, ServerIdentity, StoredResponse, StoreSettings, open_store,
)


def _row(response_id: str, previous: str | None) -> StoredResponse:
    answer = {"type": "message", "content": [{"type": "output_text", "text": "an answer " * 20}]}
    response = {"id": response_id, "status": "completed", "output": [answer]}
    items = [{"type": "message", "role": "user", "content": "a question " * 20}]
    return StoredResponse(response_id, "completed", False, previous, json.dumps(response), json.dumps(items))


async def _walk(store: ResponsesStore, response_id: str) -> list[dict[str, Any]]:
    """History the old way: one `get` per response of the chain."""
    turns = []
    next_id: str | None = response_id
    while next_id is not None:
        row = await store.get(next_id)
        if row is None:
            break
        turns.append(row.input_items() + row.output_items())
        next_id = row.previous_response_id
    return [item for turn in reversed(turns) for item in turn]


async def _timed_ms(work: Any, repeat: int) -> float:
    started = time.perf_counter()
    for _ in range(repeat):
        await work()
    return (time.perf_counter() - started) * 1000 / repeat


async def bench(location: str, depths: list[int], rounds: int) -> dict[str, Any]:
    """Figures for one store location."""
    store = open_store(location, ServerIdentity.new("bench:0"), StoreSettings())
    try:
        put_ms = [await _timed_ms(lambda: store.put(_row(uuid.uuid4().hex, None)), 200)
                  for _ in range(rounds)]
        get_ms = [await _timed_ms(lambda: store.get("missing"), 200) for _ in range(rounds)]
        figures: dict[str, Any] = {"put_ms": statistics.median(put_ms), "get_ms": statistics.median(get_ms)}
        for depth in depths:
            chain = [f"d{depth}_{i}" for i in range(depth)]
            for i, response_id in enumerate(chain):
                await store.put(_row(response_id, chain[i - 1] if i else None))
            assert await store.history(chain[-1]) == await _walk(store, chain[-1])
            cte, walk = [], []
            for _ in range(rounds):
                cte.append(await _timed_ms(lambda: store.history(chain[-1]), 20))
                walk.append(await _timed_ms(lambda: _walk(store, chain[-1]), 20))
            figures[f"history_{depth}"] = {"one_query_ms": statistics.median(cte),
                                           "row_by_row_ms": statistics.median(walk),
                                           "speedup": statistics.median(walk) / statistics.median(cte)}
        return figures
    finally:
        store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depths", type=int, nargs="+", default=[10, 100])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--postgres", default=None,
                        help="a PostgreSQL URI (default: start a throwaway server)")
    args = parser.parse_args()
    server = None
    url = args.postgres
    if url is None:
        from benchmarks.postgres_process import start_postgres

        server = start_postgres()
        url = server.new_database("store_bench")
    try:
        with tempfile.TemporaryDirectory() as folder:
            sqlite_path = str(Path(folder) / "bench.sqlite3")
            results = {"sqlite": asyncio.run(bench(sqlite_path, args.depths, args.rounds)),
                       "postgres": asyncio.run(bench(url, args.depths, args.rounds))}
    finally:
        if server is not None:
            server.stop()
    print(json.dumps(results))


if __name__ == "__main__":
    main()
