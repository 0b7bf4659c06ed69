"""Two separate structserve servers (real SmolLM2, `python -m api.cli serve`) on one PostgreSQL
Responses store: each reads, continues (previous_response_id) and deletes the other's responses,
and a background response created on A is cancelled through B (A's engine stops generating it)."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from tests.e2e.conftest import MODEL, Server, start_server, stop_server
from tests.e2e.test_operations_e2e import metric, wait_for

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def servers(postgres, tmp_path_factory) -> Iterator[tuple[Server, Server]]:
    """Servers A and B (one torch thread each) on a new database of the session's PostgreSQL."""
    url = postgres.new_database("shared_store_e2e")
    folder = tmp_path_factory.mktemp("shared_store")
    with ThreadPoolExecutor(2) as pool:
        started = list(pool.map(lambda _: start_server(folder, "--responses-db", url, threads=1), range(2)))
    yield started[0], started[1]
    stop_server(*started)


def test_servers_read_continue_and_delete_each_others_responses(servers):
    a, b = (server.client() for server in servers)
    first = a.responses.create(model=MODEL, input="Say hello.", max_output_tokens=8, temperature=0)
    assert b.responses.retrieve(first.id).model_dump() == first.model_dump()
    second = b.responses.create(model=MODEL, input="And goodbye?", previous_response_id=first.id,
                                max_output_tokens=8, temperature=0)
    assert second.previous_response_id == first.id and second.status in ("completed", "incomplete")
    assert a.responses.retrieve(second.id).output_text == second.output_text
    assert [item.type for item in a.responses.input_items.list(second.id).data] == ["message"]
    a.responses.delete(second.id)
    b.responses.delete(first.id)
    for client in (a, b):
        for response_id in (first.id, second.id):
            with pytest.raises(openai.NotFoundError):
                client.responses.retrieve(response_id)
        with pytest.raises(openai.NotFoundError):
            client.responses.create(model=MODEL, input="x", previous_response_id=second.id,
                                    max_output_tokens=4)


def test_a_background_response_on_a_is_cancelled_through_b(servers):
    server_a, server_b = servers
    a, b = server_a.client(), server_b.client()
    job = a.responses.create(model=MODEL, input="Write a long story about a lighthouse keeper.",
                             max_output_tokens=1000, temperature=0, background=True)
    wait_for(lambda: b.responses.retrieve(job.id).status == "in_progress", timeout_s=60)
    cancelled = b.responses.cancel(job.id)
    assert cancelled.status == "cancelled"
    final = a.responses.retrieve(job.id)
    assert final.status == "cancelled" and (final.usage is None or final.usage.output_tokens < 1000)
    wait_for(lambda: metric(server_a, "num_requests_running") == 0, timeout_s=10)
    assert f"response {job.id}: cancelled or deleted through the store" in server_a.log()   # A stopped it
    assert b.responses.cancel(job.id).status == "cancelled"   # cancelled is final, on both
