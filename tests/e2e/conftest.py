"""End-to-end fixtures: a real `structserve serve` process on a free loopback port."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks import server_process
from benchmarks.server_process import ROOT, ServerProcess, free_port
from tests.conftest import SERVER_MAX_MODEL_LEN

MODEL = "smollm2"
# Rows up to which a server on the default (int4) weights runs the int4 copies (`--crossover-rows`),
# pinned: measuring it at load costs about 1.8 s of CPU per start (median of 3, in process; its
# 3 s budget often runs out on the shared box, where the answer swings from 0 to 4 between starts).
# 4 is the engine's fallback (engine/models/crossover.py). The messages server
# (test_messages_e2e.py) still measures it (`crossover_rows=None`), so that path runs end to end.
CROSSOVER_ROWS = 4


def _share_ssl_contexts() -> None:
    """Build the default SSL context once per test process, not once per client: every
    `httpx.get`/`post`, `httpx.Client`/`AsyncClient` and `openai.OpenAI` (its vendored `httpx2`)
    otherwise parses the CA bundle again, about 0.1-0.2 s of CPU on the 2-core box, in polling
    loops and per soak request, taken from the server under test. The servers are plain HTTP on
    loopback; each client still opens its own connections, only the (thread-safe) default
    context, made with the default arguments, is shared."""
    import functools
    import importlib

    for name in ("httpx._transports.default", "httpx2._transports.default"):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        make = getattr(module, "create_ssl_context", None)
        if make is None or getattr(make, "shared_default", False):
            continue        # another httpx layout: clients just build their own contexts again
        default = functools.cache(functools.partial(make, verify=True, cert=None))

        def create_ssl_context(verify=True, cert=None, trust_env=True, _make=make, _default=default):
            return _default(trust_env=trust_env) if verify is True and cert is None else \
                _make(verify=verify, cert=cert, trust_env=trust_env)

        create_ssl_context.shared_default = True
        module.create_ssl_context = create_ssl_context


_share_ssl_contexts()


class Server(ServerProcess):
    """A running server (`benchmarks/server_process.py`), with an openai client factory."""

    def client(self, **kwargs):
        import openai

        return openai.OpenAI(base_url=self.url + "/v1", api_key=kwargs.pop("api_key", "none"), max_retries=0,
                             timeout=kwargs.pop("timeout", 600), **kwargs)


def start_server(tmp: Path, *args: str, env: dict[str, str] | None = None, timeout_s: float = 240.0,
                 threads: int | None = None, crossover_rows: int | None = CROSSOVER_ROWS) -> Server:
    """Start `python -m api.cli serve` (SmolLM2 as "smollm2") with `args`, logging to `tmp`, and wait
    until /health answers 200; it dies with the test run (`benchmarks/server_process.py`).

    `--num-threads` is `threads` when given (pass a share of the cores for servers that decode at
    the same time as another); None leaves the server's default, every core it may use.
    Servers run `--no-compile` unless `args` says `--compile`: compiling SmolLM2's decode step costs
    minutes of both cores with a cold on-disk cache, so only test_compiled_e2e's server compiles it,
    and waits for it (`wait_for_compile`) before sending anything. It uses the CLI's default
    `--compile-cache-dir` (~/.cache/structserve/inductor, the run's one inductor cache: tests/
    conftest.py), which persists, so a later run of the suite loads the compiled graphs from disk
    instead of compiling them.
    `crossover_rows` is passed as `--crossover-rows` (CROSSOVER_ROWS) unless it is None or `args`
    set `--crossover-rows` or `--quantization` (the tests' float32 servers have no int4 copies).
    """
    port = free_port()
    thread_args = [] if threads is None else ["--num-threads", str(threads)]
    compile_args = [] if "--compile" in args else ["--no-compile"]
    pinned = crossover_rows is not None and "--crossover-rows" not in args and "--quantization" not in args
    crossover_args = ["--crossover-rows", str(crossover_rows)] if pinned else []
    started = server_process.start_server(
        ["--served-model-name", MODEL, "--kv-cache-memory", "512MiB", "--max-model-len", str(SERVER_MAX_MODEL_LEN),
         *thread_args, *compile_args, *crossover_args, *args],
        log_path=tmp / f"server-{port}.log", env=env, timeout_s=timeout_s, port=port)
    return Server(started.url, started.proc, started.log_path)


def stop_server(*servers: Server) -> None:
    """SIGTERM the servers (all at once), wait for each, kill any still running after 30 s."""
    server_process.stop_servers(*servers)


@pytest.fixture(scope="session")
def server(tmp_path_factory) -> Iterator[Server]:
    """One shared server for the e2e tests (SmolLM2 on its int4/int8 copies at every row count,
    `--crossover-rows all`, eager). Its tests compare answers at temperature 0 across requests that
    the engine batches differently (stream vs whole, n=1 vs n=3, before vs after, alone vs
    together, cold vs cached prefixes): those kernels give a row the same bits in any batch, and a
    prompt's tokens go through the same attention kernel however the cache or the step budget
    splits them (tests/engine/test_cache_state_invariance.py). With a crossover, a step of a few
    rows would run the int4/int8 copies and a larger one the bf16/float32 copies, whose rounding can
    flip a near-tied greedy token. The default crossover and the compiled step are served by
    tests/e2e/test_compiled_e2e.py's server."""
    srv = start_server(tmp_path_factory.mktemp("server"), "--crossover-rows", "all")
    yield srv
    stop_server(srv)


@pytest.fixture(scope="session")
def batch(request, server):
    """The generation-heavy requests of the selected acceptance-case files (each test_cases_*.py
    defining `batch_jobs(server)`), sent to `server` together, once: a `cases_support.Batch`."""
    from tests.e2e.cases_support import collected_batch_jobs, run_batch

    return run_batch(server, collected_batch_jobs(request.session.items, server))


@pytest.fixture(scope="session")
def case_adapters(tmp_path_factory) -> dict[str, Path]:
    """The peft adapters of the LoRA acceptance cases (`tests/e2e/cases_lora.py`), name -> folder."""
    from tests.e2e.cases_lora import build_adapters

    return build_adapters(tmp_path_factory.mktemp("case_adapters"))


@pytest.fixture(scope="session")
def lora_runtime_server(case_adapters, tmp_path_factory) -> Iterator[Server]:
    """The run-time LoRA server of the registry cases (018, 040) and of tests/e2e/test_lora_e2e.py:
    adapter-a, ad-a (adapter-a's folder, `NAME=PATH`) and ad-b (adapter-b's folder, the JSON form
    with base_model_name "smol") loaded at start, --max-loras 2, --max-lora-rank 16, run-time
    loading on, one torch thread, float32 weights. Tests load adapters under their own names and
    leave adapters they did not load alone."""
    from tests.e2e.cases_lora import MAX_LORA_RANK, start_servers

    ad_b = f'{{"name": "ad-b", "path": "{case_adapters["adapter-b"]}", "base_model_name": "smol"}}'
    (srv,) = start_servers(
        tmp_path_factory.mktemp("lora_runtime"),
        ["--enable-lora", "--lora-modules", f"adapter-a={case_adapters['adapter-a']}",
         f"ad-a={case_adapters['adapter-a']}", ad_b, "--max-loras", "2",
         "--max-lora-rank", str(MAX_LORA_RANK), "--allow-runtime-lora", "--num-threads", "1",
         "--quantization", "none"])   # its tests compare a stream's text across batch compositions
    yield srv
    stop_server(srv)
