"""/metrics: Prometheus text that prometheus-client's own parser reads, with the engine's values."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.anyio


async def test_metrics_parse_and_carry_engine_values(client: httpx.AsyncClient) -> None:
    response = await client.get("/metrics")
    assert response.status_code == 200
    samples = {s.name: s for fam in text_string_to_metric_families(response.text) for s in fam.samples}
    assert samples["structserve:kv_cache_usage_perc"].value == 0.25
    assert samples["structserve:prefix_cache_hits_total"].value == 32
    assert samples["structserve:prefix_cache_queries_total"].value == 64
    assert samples["structserve:num_requests_running"].labels["model_name"]
