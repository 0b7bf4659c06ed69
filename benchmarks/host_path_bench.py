"""Host path per token: where a served step's time goes outside the model forward; prints one JSON line.

Starts `api.cli serve` (SmolLM2 by default) in a child process whose engine methods are wrapped with
timers (scheduler, model_runner.prepare, the forward and LM head, grammar fill, sampler, token
append with detokenizer and stop checks, output delivery), then streams `--requests` greedy chat
completions of `--max-tokens` forced tokens (ignore_eos) at concurrency `--concurrency` through the
official openai client. Reports, per generated token (c=1) or per step: the client's inter-token
time, each timed component, the engine-thread time outside them, and the CPU time of the event-loop
thread (API, SSE) from /proc, all over the measured requests only (one warm-up request first).

    .venv/bin/python benchmarks/host_path_bench.py [--concurrency 1] [--requests 5] [--max-tokens 128]
        [--num-threads 2] [--port 0] [-- extra serve flags]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

# (label, "module:Class.method"): wrapped in the server child; times nest (step holds the rest).
TIMED = [
    ("step", "engine.llm_engine:LLMEngine.step"),
    ("poll_grammars", "engine.llm_engine:LLMEngine._poll_grammars"),
    ("scheduler.schedule", "engine.scheduler:Scheduler.schedule"),
    ("scheduler.update_after_step", "engine.scheduler:Scheduler.update_after_step"),
    ("grammar.start_fill", "engine.structured_output:StructuredOutputManager.start_fill"),
    ("model_runner.execute", "engine.model_runner:ModelRunner.execute"),
    ("model_runner.prepare", "engine.model_runner:ModelRunner.prepare"),
    ("model_runner.prepare_lora", "engine.model_runner:ModelRunner.prepare_lora"),
    ("sampler.sample", "engine.sampler:Sampler.sample"),
    ("append_token", "engine.llm_engine:LLMEngine._append_token"),
    ("detokenizer.add_tokens", "engine.detokenizer:IncrementalDetokenizer.add_tokens"),
    ("make_output", "engine.llm_engine:LLMEngine._make_output"),
    ("async.deliver", "engine.async_engine:AsyncEngine._deliver"),
    ("async.drain_inbox", "engine.async_engine:AsyncEngine._drain_inbox"),
    ("async.expire_requests", "engine.async_engine:AsyncEngine._expire_requests"),
]


def _thread_cpu_s() -> dict[str, float]:
    """CPU seconds (user + system) of each thread of this process, by thread name, from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    names = {t.native_id: t.name for t in threading.enumerate()}
    out: dict[str, float] = defaultdict(float)
    for tid in os.listdir("/proc/self/task"):
        try:
            fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
            comm = Path(f"/proc/self/task/{tid}/comm").read_text().strip()
        except OSError:
            continue
        out[names.get(int(tid), f"native:{comm}")] += (int(fields[11]) + int(fields[12])) / tick
    return dict(out)


def _wrap(totals: dict[str, list[float]], label: str, target: str) -> None:
    """Replace `target` ("module:Class.method") by a version adding its wall time, call count and
    CPU time of the calling thread to totals[label]."""
    import importlib

    module_name, qualname = target.split(":")
    cls_name, method = qualname.split(".")
    cls = getattr(importlib.import_module(module_name), cls_name)
    original = getattr(cls, method)

    def timed(*args: Any, **kwargs: Any) -> Any:
        start, start_cpu = time.perf_counter(), time.thread_time()
        try:
            return original(*args, **kwargs)
        finally:
            entry = totals[label]
            entry[0] += time.perf_counter() - start
            entry[1] += 1
            entry[2] += time.thread_time() - start_cpu

    setattr(cls, method, timed)


def serve_child(out_path: str, serve_args: list[str]) -> None:
    """Server mode: wrap TIMED (and the model's forward / compute_logits once loaded), serve;
    SIGUSR1 resets the counters, SIGUSR2 writes them with per-thread CPU time to `out_path`."""
    sys.path.insert(0, str(ROOT))
    totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0, 0.0])
    for label, target in TIMED:
        _wrap(totals, label, target)
    import engine.model_runner as model_runner

    original_init = model_runner.ModelRunner.__init__

    def init(self: Any, model: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, model, *args, **kwargs)
        for label, name in (("model.forward", "forward"), ("model.compute_logits", "compute_logits")):
            fn = getattr(model, name)

            def timed(*a: Any, _fn: Callable[..., Any] = fn, _label: str = label, **kw: Any) -> Any:
                start, start_cpu = time.perf_counter(), time.thread_time()
                try:
                    return _fn(*a, **kw)
                finally:
                    totals[_label][0] += time.perf_counter() - start
                    totals[_label][1] += 1
                    totals[_label][2] += time.thread_time() - start_cpu

            setattr(model, name, timed)

    model_runner.ModelRunner.__init__ = init   # type: ignore[method-assign]
    window: dict[str, Any] = {"cpu": _thread_cpu_s(), "t": time.perf_counter()}

    def reset(*_: Any) -> None:
        totals.clear()
        window.update(cpu=_thread_cpu_s(), t=time.perf_counter())

    def dump(*_: Any) -> None:
        cpu = _thread_cpu_s()
        data = {"wall_s": time.perf_counter() - window["t"],
                "timed": {k: {"s": v[0], "calls": v[1], "cpu_s": v[2]} for k, v in totals.items()},
                "thread_cpu_s": {k: round(v - window["cpu"].get(k, 0.0), 3) for k, v in cpu.items()}}
        Path(out_path).write_text(json.dumps(data))

    signal.signal(signal.SIGUSR1, reset)
    signal.signal(signal.SIGUSR2, dump)
    from api.cli import main

    main(["serve", *serve_args])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def stream_one(client: Any, model: str, max_tokens: int, index: int) -> list[float]:
    """Chunk arrival times (s) of one streamed greedy chat completion of `max_tokens` tokens."""
    times = []
    stream = await client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": f"Tell me about the number {index}."}],
        max_tokens=max_tokens, temperature=0.0, stream=True, extra_body={"ignore_eos": True})
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content is not None:
            times.append(time.perf_counter())
    return times


async def drive(base_url: str, concurrency: int, requests: int, max_tokens: int) -> dict[str, float]:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=base_url, api_key="none", max_retries=0, timeout=600)
    model = (await client.models.list()).data[0].id
    gaps: list[float] = []
    start = time.perf_counter()
    for batch in range(requests):
        runs = await asyncio.gather(*[stream_one(client, model, max_tokens, batch * concurrency + i)
                                      for i in range(concurrency)])
        for times in runs:
            gaps += [b - a for a, b in zip(times, times[1:])]
    wall = time.perf_counter() - start
    await client.close()
    return {"wall_s": wall, "itl_ms_median": statistics.median(gaps) * 1e3,
            "itl_ms_mean": statistics.mean(gaps) * 1e3, "num_chunks": len(gaps) + requests * concurrency}


def wait_ready(base_url: str, proc: subprocess.Popen[bytes], timeout_s: float = 300.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode}")
        try:
            if httpx.get(base_url.removesuffix("/v1") + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SystemExit("server did not become ready")


def report(stats: dict[str, Any], client: dict[str, float], concurrency: int) -> dict[str, Any]:
    """Figures in ms per engine step (= per token at c=1) from the server's totals and the client's times.

    per_step_ms is wall time (waits for the GIL and for a core included), per_step_cpu_ms the CPU
    time of the engine thread in the same calls (torch's worker threads not included).
    host_in_step: step minus the model forward and LM head; engine_loop_outside_step: the async
    engine's delivery, inbox and deadline work between steps; event_loop_cpu: CPU time of the
    API thread (uvicorn, endpoint, SSE), which runs beside the engine thread and takes the GIL.
    """
    timed = stats["timed"]
    steps = max(timed.get("step", {}).get("calls", 0), 1)
    per = {k: round(v["s"] / steps * 1e3, 3) for k, v in sorted(timed.items())}
    per_cpu = {k: round(v["cpu_s"] / steps * 1e3, 3) for k, v in sorted(timed.items())}
    forward = per.get("model.forward", 0.0) + per.get("model.compute_logits", 0.0)
    outside = sum(per.get(k, 0.0) for k in ("async.deliver", "async.drain_inbox", "async.expire_requests"))
    return {
        "concurrency": concurrency, "steps": steps, "client": client, "per_step_ms": per,
        "per_step_cpu_ms": per_cpu,
        "forward_ms": round(forward, 3),
        "host_in_step_ms": round(per.get("step", 0.0) - forward, 3),
        "engine_loop_outside_step_ms": round(outside, 3),
        "event_loop_cpu_ms": round(stats["thread_cpu_s"].get("MainThread", 0.0) / steps * 1e3, 3),
        "wall_per_step_ms": round(stats["wall_s"] / steps * 1e3, 3),
        "thread_cpu_s": stats["thread_cpu_s"],
    }


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--serve-child":
        serve_child(sys.argv[2], sys.argv[3:])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--requests", type=int, default=5, help="measured rounds of `concurrency` requests")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--num-threads", type=int, default=2)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("serve_flags", nargs="*", help="extra `serve` flags (after --)")
    args = parser.parse_args()
    port = args.port or free_port()
    base_url = f"http://127.0.0.1:{port}/v1"
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "stats.json")
        cmd = [sys.executable, __file__, "--serve-child", out, "--port", str(port), "--num-threads",
               str(args.num_threads), *args.serve_flags]
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            wait_ready(base_url, proc)
            asyncio.run(drive(base_url, args.concurrency, 1, args.max_tokens))    # warm-up
            proc.send_signal(signal.SIGUSR1)
            time.sleep(0.2)
            client = asyncio.run(drive(base_url, args.concurrency, args.requests, args.max_tokens))
            proc.send_signal(signal.SIGUSR2)
            for _ in range(50):
                if Path(out).exists():
                    break
                time.sleep(0.1)
            stats = json.loads(Path(out).read_text())
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
    print(json.dumps(report(stats, client, args.concurrency)))


if __name__ == "__main__":
    main()
