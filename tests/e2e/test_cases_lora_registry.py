"""Acceptance case 040 (../shared/cases): the adapter registry stays consistent under duplicate,
aliased, in-place and concurrent loads and unloads: one name is one adapter, unload removes it
everywhere (the model list, routing, the prefix cache), and the base model is left untouched.
End to end on the runtime-LoRA server shared with case 018 (`lora_runtime_server`, conftest.py).

Reference texts come from the same server: adapter-a's and adapter-b's folders loaded under this
file's own names (`r040-a`, `r040-b`), so the tests do not depend on what case 018 left loaded.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.e2e.cases_support import HTTP, case_steps, error_problems, parallel, post
from tests.e2e.conftest import MODEL, Server

pytestmark = pytest.mark.slow

CHAT = "/v1/chat/completions"


def load(srv: Server, name: str, folder: Any, inplace: bool = False) -> httpx.Response:
    return post(srv.url + "/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(folder),
                                                    "load_inplace": inplace})


def unload(srv: Server, name: str) -> httpx.Response:
    return post(srv.url + "/v1/unload_lora_adapter", {"lora_name": name}, timeout=600)


def listed(srv: Server, name: str) -> int:
    """How many times /v1/models lists `name`."""
    return [m["id"] for m in HTTP.get(srv.url + "/v1/models", timeout=10).json()["data"]].count(name)


def chat_body(model: str) -> dict[str, Any]:
    """The case's step-4 body for `model`."""
    return {**case_steps("040")[3]["body"], "model": model}


def text_of(srv: Server, model: str) -> str:
    resp = post(srv.url + CHAT, chat_body(model))
    assert resp.status_code == 200, (model, resp.text)
    assert resp.json()["model"] == model, resp.json()["model"]
    return resp.json()["choices"][0]["message"]["content"]


def check_not_found(resp: httpx.Response) -> None:
    assert not error_problems(resp, 404), error_problems(resp, 404)
    assert resp.json()["error"]["code"] == "model_not_found", resp.text


def check_duplicate(resp: httpx.Response) -> bool:
    """A second load of a taken name: refused with 400/409 and the error object (False), or
    accepted as an in-place replacement (True); never a 5xx."""
    if resp.status_code == 200:
        return True
    assert resp.status_code in (400, 409), resp.text
    assert not error_problems(resp, resp.status_code), error_problems(resp, resp.status_code)
    return False


@pytest.fixture(scope="module")
def references(lora_runtime_server, case_adapters) -> Iterator[dict[str, str]]:
    """Step-4 texts of the base model and of adapter-a's and adapter-b's weights, before any step."""
    srv = lora_runtime_server
    loads = parallel(*[lambda n=n, f=f: load(srv, n, case_adapters[f]) for n, f in
                       (("r040-a", "adapter-a"), ("r040-b", "adapter-b"))])
    assert [r.status_code for r in loads] == [200, 200], [r.text for r in loads]
    texts = dict(zip(("base", "a", "b"), parallel(*[lambda m=m: text_of(srv, m) for m in (MODEL, "r040-a", "r040-b")])))
    assert len(set(texts.values())) == 3, texts
    yield texts
    for name in ("r040-a", "r040-b"):
        assert unload(srv, name).status_code == 200


def test_case040_duplicate_and_aliased_loads(lora_runtime_server, case_adapters, references):
    srv = lora_runtime_server
    steps = case_steps("040")
    folders = {"<adapter-a-dir>": case_adapters["adapter-a"], "<adapter-b-dir>": case_adapters["adapter-b"]}
    first, again, other = (steps[i]["body"] for i in range(3))
    assert (first["lora_name"], first["lora_path"], other["lora_path"]) == ("dup-x", "<adapter-a-dir>",
                                                                           "<adapter-b-dir>")
    assert load(srv, "dup-x", folders[first["lora_path"]]).status_code == 200
    assert listed(srv, "dup-x") == 1
    check_duplicate(load(srv, "dup-x", folders[again["lora_path"]]))
    assert listed(srv, "dup-x") == 1
    replaced = check_duplicate(load(srv, "dup-x", folders[other["lora_path"]]))
    assert listed(srv, "dup-x") == 1
    assert text_of(srv, "dup-x") == references["b" if replaced else "a"]
    assert unload(srv, "dup-x").status_code == 200
    check_not_found(post(srv.url + CHAT, chat_body("dup-x")))
    assert listed(srv, "dup-x") == 0
    second = unload(srv, "dup-x")
    assert second.status_code in (400, 404) and not error_problems(second, second.status_code), second.text
    for name in ("dup-y", "dup-z"):
        assert load(srv, name, folders[steps[6]["body"]["lora_path"]]).status_code == 200
    assert unload(srv, "dup-y").status_code == 200
    assert text_of(srv, "dup-z") == references["a"]
    check_not_found(post(srv.url + CHAT, chat_body("dup-y")))
    assert unload(srv, "dup-z").status_code == 200
    assert text_of(srv, MODEL) == references["base"]


def test_case040_neighbours_reload_swaps_weights_everywhere(lora_runtime_server, case_adapters, references):
    """In place with other weights, and unloaded then loaded again under the same name with other
    weights: listed once, and the next request gets the new weights (no registry entry, slot or
    prefix-cache block of the old ones is used)."""
    srv = lora_runtime_server
    assert load(srv, "dup-w", case_adapters["adapter-a"]).status_code == 200
    assert text_of(srv, "dup-w") == references["a"]
    assert load(srv, "dup-w", case_adapters["adapter-b"], inplace=True).status_code == 200
    assert listed(srv, "dup-w") == 1
    assert text_of(srv, "dup-w") == references["b"]
    assert unload(srv, "dup-w").status_code == 200
    assert load(srv, "dup-w", case_adapters["adapter-a"]).status_code == 200
    assert text_of(srv, "dup-w") == references["a"]
    assert unload(srv, "dup-w").status_code == 200
    assert listed(srv, "dup-w") == 0
    assert text_of(srv, MODEL) == references["base"]


def test_case040_neighbours_concurrent_loads_and_unloads(lora_runtime_server, case_adapters, references):
    """Four loads of one new name sent together: exactly one 200, the others refused with the
    error object (or all accepted as replacements), listed once, adapter-a's text; four unloads
    together: exactly one 200, the others 404."""
    srv = lora_runtime_server
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        loads = list(pool.map(lambda _: load(srv, "dup-r", case_adapters["adapter-a"]), range(4)))
    accepted = [check_duplicate(r) for r in loads]
    assert accepted.count(True) >= 1, [r.text for r in loads]
    assert listed(srv, "dup-r") == 1
    assert text_of(srv, "dup-r") == references["a"]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        unloads = list(pool.map(lambda _: unload(srv, "dup-r"), range(4)))
    assert sorted(r.status_code for r in unloads) == [200, 404, 404, 404], [r.text for r in unloads]
    for r in unloads:
        if r.status_code == 404:
            check_not_found(r)
    assert listed(srv, "dup-r") == 0
    check_not_found(post(srv.url + CHAT, chat_body("dup-r")))
