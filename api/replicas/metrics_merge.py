"""One Prometheus exposition of every engine replica's /metrics, each sample labelled `replica`.

Each replica renders its own registry (`api/observability/metrics.py`); the ingress parses the
texts (prometheus_client's parser), adds `replica="<rank>"` to every sample, joins the samples of
each metric family under one HELP/TYPE header (the text format wants a family's samples together)
and adds `structserve:replica_process_id{replica}`, the process id of each replica.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

REPLICA_LABEL = "replica"


class _Merged:
    """A collector yielding fixed, already merged families."""

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        yield from self._families


def merge_metrics(texts: Mapping[int, tuple[str, str]]) -> bytes:
    """The text exposition (format 0.0.4) of `{rank: (exposition text, process id)}`; ranks with an
    empty process id get no process-id sample. Raises ValueError on a text that does not parse."""
    families: dict[str, Metric] = {}
    for rank, (text, _) in sorted(texts.items()):
        for family in text_string_to_metric_families(text):
            merged = families.setdefault(family.name, Metric(family.name, family.documentation, family.type,
                                                             family.unit))
            merged.samples.extend(
                Sample(s.name, {**s.labels, REPLICA_LABEL: str(rank)}, s.value, s.timestamp, s.exemplar)
                for s in family.samples)
    pids = GaugeMetricFamily("structserve:replica_process_id", "process id of each engine replica",
                             labels=[REPLICA_LABEL])
    for rank, (_, pid) in sorted(texts.items()):
        if pid:
            pids.add_metric([str(rank)], float(pid))
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Merged([*families.values(), pids]))   # type: ignore[arg-type]
    return generate_latest(registry)
