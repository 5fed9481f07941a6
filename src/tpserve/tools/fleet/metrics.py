"""The fleet's /metrics: every replica's metrics in one exposition, each sample labelled `replica="<i>"` (a
remote replica: its URL), the router's own (`smg_*`), and per replica whether it is up and how often it was
restarted. One scrape target for Prometheus; `sum by (replica)` etc. work as with any labelled job."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families


def merge(texts: dict[str, str], label: str = "replica") -> list[Metric]:
    """Metric families of several expositions, each sample given `label`=<its source>; families of the same
    name merged into one (an exposition may declare a family once)."""
    families: dict[str, Metric] = {}
    for source, text in texts.items():
        for fam in text_string_to_metric_families(text):
            merged = families.get(fam.name)
            if merged is None:
                merged = families[fam.name] = Metric(fam.name, fam.documentation, fam.type, fam.unit)
            merged.samples += [s._replace(labels={**s.labels, label: source}) for s in fam.samples]
    return list(families.values())


def render(families: list[Metric]) -> bytes:
    registry = CollectorRegistry(auto_describe=False)

    class _Fixed:
        def collect(self):
            return families

    registry.register(_Fixed())
    return generate_latest(registry)


def fetch(urls: dict[str, str], api_key: str | None, timeout: float = 3.0) -> dict[str, str | None]:
    """source -> the text of its /metrics URL (None when it does not answer 200)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def one(url: str) -> str | None:
        try:
            r = httpx.get(url, headers=headers, timeout=timeout)
        except httpx.HTTPError:
            return None
        return r.text if r.status_code == 200 else None

    if not urls:
        return {}
    with ThreadPoolExecutor(min(len(urls), 16)) as pool:
        return dict(zip(urls, pool.map(one, urls.values())))


def fleet_metrics(fleet, api_key: str | None) -> bytes:
    sources = {r.name: r.url + "/metrics" for r in fleet.replicas}
    sources.update({url: url.rstrip("/") + "/metrics" for url in fleet.remote_urls})
    texts = fetch(sources, api_key)
    families = merge({k: v for k, v in texts.items() if v is not None})
    up = GaugeMetricFamily("tpserve_fleet:replica_up", "1 when the replica answered its /metrics", labels=["replica"])
    restarts = GaugeMetricFamily("tpserve_fleet:replica_restarts", "Times the fleet restarted the replica",
                                 labels=["replica"])
    for source, text in texts.items():
        up.add_metric([source], float(text is not None))
    for r in fleet.replicas:
        restarts.add_metric([r.name], float(r.restarts))
    families += [up, restarts]
    try:
        families += list(text_string_to_metric_families(fleet.router.metrics()))
    except (httpx.HTTPError, ValueError):
        pass
    return render(families)
