"""The queues controller runs a pod's tidelease.io/throughput-query only scoped to the pod's
namespace; a query that cannot be scoped is never run, and told once (a Warning Event on the
pod, a log line)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

import pytest
from prometheus_client import CollectorRegistry

from common import contract
from common.kubeclient import KubeClient
from extender.cluster.store import Store
from extender.queues.controller import Elastics, QueueMetrics, QueuesController, QueueSettings
from extender.queues.measuring import Profiler
from extender.queues.testing import FakeReader


@dataclass
class Kube:
    """Records what the controller sends."""

    sent: list[tuple[str, str, Any]] = field(default_factory=list)

    async def json(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
        self.sent.append((method, path, kw.get("body")))
        return {}


def controller(label: str = "namespace") -> tuple[QueuesController, Kube, FakeReader]:
    kube, reader, registry = Kube(), FakeReader(), CollectorRegistry()
    ctl = QueuesController(
        cast(KubeClient, kube),
        cast(Store, None),  # not watched here
        namespace="tidelease-system",
        settings=QueueSettings(tenant_query_label=label),
        metrics=QueueMetrics(registry),
        profiler=Profiler(reader, registry=registry),
    )
    return ctl, kube, reader


def meta(uid: str = "u1") -> dict[str, Any]:
    return {"namespace": "team-b", "name": "trainer-0", "uid": uid}


def test_the_query_is_scoped_to_the_pod_namespace() -> None:
    ctl, _, _ = controller(label="k8s_namespace")
    elastic = Elastics(ctl, {}, 0.0)
    elastic._scope("team-b/trainer", meta(), 'sum(rate(samples_total{job="t"}[1m]))')
    assert elastic.queries == {
        "team-b/trainer": 'sum(rate(samples_total{job="t",k8s_namespace="team-b"}[1m]))'
    }
    assert not elastic.refused


async def test_a_query_reading_another_namespace_is_refused_once_with_an_event(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ctl, kube, reader = controller()
    query = 'sum(rate(samples_total{namespace="team-a"}[1m]))'
    for _ in range(2):  # two passes: told once
        elastic = Elastics(ctl, {}, 0.0)
        elastic._scope("team-b/trainer", meta(), query)
        assert not elastic.queries  # nothing to run
        await elastic.profile()
    assert reader.calls == 0
    [(method, path, body)] = kube.sent
    assert (method, path) == ("POST", "/api/v1/namespaces/team-b/events")
    assert body["type"] == "Warning"
    assert body["reason"] == "ThroughputQueryRefused"
    assert body["involvedObject"]["name"] == "trainer-0"
    assert contract.ANN_THROUGHPUT_QUERY in body["message"]
    assert 'namespace="team-a"' in body["message"]
    assert caplog.text.count(contract.ANN_THROUGHPUT_QUERY) == 1
    # A new pod (another uid) with the same query is told again; a fixed query is forgotten.
    elastic = Elastics(ctl, {}, 0.0)
    elastic._scope("team-b/trainer", meta("u2"), query)
    await elastic.profile()
    assert len(kube.sent) == 2
    await Elastics(ctl, {}, 0.0).profile()
    assert ctl.refused_queries == {}
