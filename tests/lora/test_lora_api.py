"""The LoRA HTTP surface over a real AsyncEngine (tiny Llama, CPU) through httpx: adapters as
`model`, /v1/models with parent/root, 404 for unknown names, run-time load/unload (bad folders are
clear 400s and the server keeps serving; unloading an adapter in use waits for its streams)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import torch
from lora_support import make_adapters, make_engine, peft_model, reference_greedy, save_tiny_llama

from api.app import create_app
from api.config import ServerConfig
from engine.async_engine import AsyncEngine
from lora.config import LoraConfig, LoraModuleSpec

PROMPT = "Hello LoRA"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> tuple[Path, dict[str, Path]]:
    tmp = tmp_path_factory.mktemp("lora_api")
    save_tiny_llama(tmp / "base")
    specs = {"ad1": (4, 8, ["q_proj", "v_proj"], False), "ad2": (8, 8, ["o_proj", "down_proj"], False),
             "big": (16, 16, ["q_proj"], False)}
    return tmp / "base", make_adapters(tmp, tmp / "base", specs)


def expected_text(base_dir: Path, folder: Path | None, max_tokens: int) -> str:
    tokens, _ = reference_greedy(peft_model(base_dir, folder), list(PROMPT.encode()), max_tokens)
    return bytes(tokens).decode("utf-8", errors="replace")


@pytest.fixture
async def client(setup, request) -> AsyncIterator[httpx.AsyncClient]:
    """httpx client over the app; `client.engine` is the AsyncEngine behind it."""
    base_dir, folders = setup
    torch.set_num_threads(1)
    options = getattr(request, "param", {})
    lora = LoraConfig(max_loras=2, max_lora_rank=8, modules=(LoraModuleSpec("ad1", str(folders["ad1"]), "tiny-hf"),))
    engine = AsyncEngine(make_engine(base_dir, lora, max_num_seqs=8), "tiny", str(base_dir))
    config = ServerConfig(sse_ping_interval_s=0, served_model_names=("tiny",),
                          allow_runtime_lora=options.get("allow_runtime_lora", True),
                          api_key=options.get("api_key"))
    app = create_app(engine, config)
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test",
                                     timeout=120) as c:
            c.engine = engine  # type: ignore[attr-defined]
            yield c
    finally:
        engine.shutdown()


def completion(model: str, max_tokens: int = 6, **extra) -> dict:
    return {"model": model, "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            **extra}


@pytest.mark.anyio
async def test_adapter_as_model_and_models_list(client, setup) -> None:
    base_dir, folders = setup
    models = (await client.get("/v1/models")).json()["data"]
    assert [(m["id"], m["parent"], m["root"]) for m in models] == [
        ("tiny", None, str(base_dir)), ("ad1", "tiny-hf", str(folders["ad1"]))]
    response = await client.post("/v1/completions", json=completion("ad1"))
    assert response.status_code == 200 and response.json()["model"] == "ad1"
    assert response.json()["choices"][0]["text"] == expected_text(base_dir, folders["ad1"], 6)
    base = (await client.post("/v1/completions", json=completion("tiny"))).json()
    assert base["choices"][0]["text"] == expected_text(base_dir, None, 6)
    missing = await client.post("/v1/completions", json=completion("nope"))
    error = missing.json()["error"]
    assert missing.status_code == 404 and error["code"] == "model_not_found"
    assert "Available models: tiny, ad1" in error["message"]


@pytest.mark.anyio
async def test_bad_adapter_folders_are_400s_and_serving_goes_on(client, setup, tmp_path: Path) -> None:
    base_dir, folders = setup
    (tmp_path / "empty").mkdir()
    cases = [
        ({"lora_name": "x", "lora_path": str(tmp_path / "missing")}, "invalid_lora_adapter", "does not exist"),
        ({"lora_name": "x", "lora_path": str(tmp_path / "empty")}, "invalid_lora_adapter", "no adapter_config.json"),
        ({"lora_name": "x", "lora_path": "~no-such-user-x/a"}, "invalid_lora_adapter", "does not exist"),
        ({"lora_name": "x", "lora_path": "a" * 300}, "invalid_lora_adapter", "cannot be read"),
        ({"lora_name": "x", "lora_path": str(folders["big"])}, "invalid_lora_adapter", "exceeds --max-lora-rank 8"),
        ({"lora_name": "ad1", "lora_path": str(folders["ad2"])}, "lora_adapter_exists", "already been loaded"),
        ({"lora_name": "tiny", "lora_path": str(folders["ad2"])}, None, "base model's name"),
        ({"lora_name": "x"}, None, "lora_path"),
    ]
    for body, code, message in cases:
        response = await client.post("/v1/load_lora_adapter", json=body)
        assert response.status_code == 400, body
        error = response.json()["error"]
        assert error["code"] == code and message in error["message"], error
    unknown = await client.post("/v1/unload_lora_adapter", json={"lora_name": "x"})
    assert unknown.status_code == 404 and "cannot be found" in unknown.json()["error"]["message"]
    ok = await client.post("/v1/completions", json=completion("ad1"))
    assert ok.status_code == 200 and ok.json()["choices"][0]["text"] == expected_text(base_dir, folders["ad1"], 6)


async def stream_text(client: httpx.AsyncClient, body: dict) -> str:
    """The streamed text; checks the SSE framing (no error event, closing [DONE])."""
    text = ""
    lines = []
    async with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            lines.append(line)
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            assert "error" not in chunk
            text += "".join(choice["text"] for choice in chunk["choices"])
    assert [line for line in lines if line][-1] == "data: [DONE]"
    return text


async def running(client: httpx.AsyncClient, num_requests: int) -> None:
    """Wait until the engine runs `num_requests` requests (ASGITransport hands a streamed body
    over only once it is complete, so the engine is watched instead of the first chunk)."""
    while client.engine.stats().num_requests_running < num_requests:  # type: ignore[attr-defined]
        await asyncio.sleep(0.005)


@pytest.mark.anyio
async def test_load_and_unload_while_streaming(client, setup) -> None:
    base_dir, folders = setup
    streams = [asyncio.create_task(stream_text(client, completion(model, 200))) for model in ("ad1", "ad1", "tiny")]
    await running(client, 3)
    loaded = await client.post("/v1/load_lora_adapter", json={"lora_name": "ad2", "lora_path": str(folders["ad2"])})
    assert loaded.status_code == 200 and "added successfully" in loaded.text
    ad2 = await client.post("/v1/completions", json=completion("ad2"))
    assert ad2.status_code == 200 and ad2.json()["model"] == "ad2"
    assert ad2.json()["choices"][0]["text"] == expected_text(base_dir, folders["ad2"], 6)
    unload = asyncio.create_task(client.post("/v1/unload_lora_adapter", json={"lora_name": "ad1"}))
    texts = await asyncio.gather(*streams)
    assert (await unload).status_code == 200
    assert texts == [expected_text(base_dir, folders["ad1"], 200)] * 2 + [expected_text(base_dir, None, 200)]
    models = [m["id"] for m in (await client.get("/v1/models")).json()["data"]]
    assert models == ["tiny", "ad2"]
    gone = await client.post("/v1/completions", json=completion("ad1"))
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "model_not_found"


@pytest.mark.anyio
async def test_unload_waits_for_the_adapters_requests(client, setup) -> None:
    stream = asyncio.create_task(stream_text(client, completion("ad1", 200)))
    await running(client, 1)
    response = await client.post("/v1/unload_lora_adapter", json={"lora_name": "ad1"})
    assert response.status_code == 200        # answered only once the engine finished the request:
    assert client.engine.stats().num_requests_running == 0  # type: ignore[attr-defined]
    assert await stream == expected_text(setup[0], setup[1]["ad1"], 200)


@pytest.mark.anyio
@pytest.mark.parametrize("client", [{"allow_runtime_lora": False}], indirect=True)
async def test_runtime_loading_needs_the_flag(client, setup) -> None:
    _, folders = setup
    response = await client.post("/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": str(folders["ad2"])})
    assert response.status_code == 400 and "--allow-runtime-lora" in response.json()["error"]["message"]


@pytest.mark.anyio
@pytest.mark.parametrize("client", [{"api_key": "sekret"}], indirect=True)
async def test_runtime_loading_needs_the_api_key(client, setup) -> None:
    _, folders = setup
    body = {"lora_name": "x", "lora_path": str(folders["ad2"])}
    assert (await client.post("/v1/load_lora_adapter", json=body)).status_code == 401
    authorized = await client.post("/v1/load_lora_adapter", json=body, headers={"Authorization": "Bearer sekret"})
    assert authorized.status_code == 200
