"""A default server (the GGUF's quantized weights) on its compiled decode step: once the background
compile is ready,
decode steps run compiled (the /metrics counter moves) and answers stay what the API promises:
stream equal to whole at temperature 0, json_schema answers that validate, forced tool calls whose
arguments validate, n > 1 with a seed reproducible."""

from __future__ import annotations

import concurrent.futures
import json
import re

import httpx
import jsonschema
import pytest

from tests.conftest import COMPILED_CROSSOVER_ROWS
from tests.e2e.conftest import start_server, stop_server

# the first test's setup waits for the server's background compile: from a cold on-disk cache on a
# 2-core AVX2 box that took more than the suite's default 600 s (seconds from a warm one)
pytestmark = pytest.mark.timeout(1500)

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
          "required": ["city", "days"], "additionalProperties": False}
TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
                                         "parameters": SCHEMA}}


def _counter(server, name: str) -> float:
    text = httpx.get(server.url + "/metrics", timeout=30).text
    match = re.search(rf"^structserve:{name}_total\{{[^}}]*\}} ([0-9.e+]+)$", text, re.M)
    assert match, f"no {name} counter in /metrics"
    return float(match.group(1))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """Default flags and `--compile`, past its background compile (a graph on each side of the
    int4/bf16 crossover, pinned so that the graphs are the same in every run), which says what the
    on-disk cache (the default --compile-cache-dir, so warm from an earlier run of the suite) served."""
    srv = start_server(tmp_path_factory.mktemp("compiled"), "--compile", "--crossover-rows", str(COMPILED_CROSSOVER_ROWS))
    try:
        outcome = srv.wait_for_compile(timeout_s=1400)
        assert "compiled decode step ready" in outcome and "on-disk cache" in outcome, srv.log()[-4000:]
        yield srv
    finally:
        stop_server(srv)


def test_compiled_step_serves_decodes_and_keeps_the_api_promises(server) -> None:
    client = server.client()
    before = _counter(server, "compiled_steps")
    messages = [{"role": "user", "content": "Name three colours of the rainbow."}]
    # first caches the prompt's blocks, so that the whole answer and the stream below both start from
    # the same prefix-cache hit: a cold prefill runs the prompt through the bf16 copies, a hit's short
    # tail through the int4 ones, and on a near-tie that alone can change a greedy answer
    client.chat.completions.create(model="smollm2", messages=messages, temperature=0, max_tokens=1)
    whole = client.chat.completions.create(model="smollm2", messages=messages, temperature=0, max_tokens=32)
    streamed = "".join(chunk.choices[0].delta.content or ""
                       for chunk in client.chat.completions.create(model="smollm2", messages=messages,
                                                                   temperature=0, max_tokens=32, stream=True)
                       if chunk.choices)
    assert whole.choices[0].message.content and streamed == whole.choices[0].message.content
    assert _counter(server, "compiled_steps") > before + 10, "decode steps did not run compiled"
    many = [{"role": "user", "content": f"Count from {i} to {i + 20}."} for i in range(12)]
    with concurrent.futures.ThreadPoolExecutor(12) as pool:   # past COMPILED_CROSSOVER_ROWS (8): the other graph
        outs = list(pool.map(lambda m: client.chat.completions.create(model="smollm2", messages=[m],
                                                                      temperature=0, max_tokens=24), many))
    assert all(o.choices[0].message.content for o in outs)
    assert "turned off" not in server.log(), server.log()[-4000:]

    answer = client.chat.completions.create(
        model="smollm2", temperature=0, max_tokens=64,
        messages=[{"role": "user", "content": "Plan a trip to Rome: give the city and the number of days."}],
        response_format={"type": "json_schema", "json_schema": {"name": "trip", "schema": SCHEMA}})
    if answer.choices[0].finish_reason == "stop":
        jsonschema.validate(json.loads(answer.choices[0].message.content), SCHEMA)

    call = client.chat.completions.create(
        model="smollm2", temperature=0, max_tokens=96, tools=[TOOL], tool_choice="required",
        messages=[{"role": "user", "content": "What is the weather in Paris for the next 3 days?"}])
    calls = call.choices[0].message.tool_calls
    assert calls and call.choices[0].finish_reason == "tool_calls"
    for tool_call in calls:
        assert tool_call.function.name == "get_weather"
        jsonschema.validate(json.loads(tool_call.function.arguments), SCHEMA)

    def sampled() -> list[str]:
        out = client.chat.completions.create(model="smollm2", messages=messages, temperature=1.0, top_p=0.9,
                                             max_tokens=16, n=2, seed=7)
        return [choice.message.content for choice in out.choices]

    first = sampled()
    assert len(first) == 2 and first == sampled()


def test_a_server_without_a_gpu_never_loads_triton(server) -> None:
    """kernels/triton_runtime.py hides triton on a machine without a GPU, from our kernels and from
    torch's compiler alike: the compiled server has not mapped triton's library (~67 MiB resident)."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: triton runs here")
    with open(f"/proc/{server.proc.pid}/maps") as maps:
        mapped = maps.read()
    assert "torch" in mapped and "libtriton" not in mapped
