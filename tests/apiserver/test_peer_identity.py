"""The peer cache's identity check against the real API server, with the chart's RBAC (issue 31):
tokens issued by kube-apiserver's TokenRequest, as the kubelet issues an agent's projected token,
reviewed with the agent's own ServiceAccount token. A peer presenting another node's identity
(a workload's token on that node, an agent token not bound to a pod, one for the API server's
audience), or none, gets nothing from the cache; an agent's pod-bound token for the cache's
audience gets what it asks for, logged with its node."""

from __future__ import annotations

import logging
from pathlib import Path

import aiohttp
import pytest

from common.kubeclient import KubeClient
from nodeagent.cache.cachestore import CacheStore
from nodeagent.cache.identity import DEFAULT_AUDIENCE, service_account_user
from nodeagent.cache.naming import EntryId, Kind
from nodeagent.cache.peerauth import TokenReviewVerifier
from nodeagent.cache.testing import random_file, start_peer
from tests.apiserver.kubectl import Kubectl
from tests.apiserver.test_rbac import NS, cluster, pod_on, token
from tests.kubeconfigs import write_kubeconfig

pytestmark = pytest.mark.apiserver
__all__ = ["cluster"]  # the fixture, imported for its use here

CKPT = EntryId("job-a.step-7")


def issued(
    c: Kubectl, account: str, namespace: str, *, audience: str | None, pod: str | None
) -> str:
    """A token from kube-apiserver's TokenRequest, as the kubelet asks for a projected one."""
    args = ["create", "token", account, "-n", namespace]
    if audience is not None:
        args += ["--audience", audience]
    if pod is not None:
        args += ["--bound-object-kind", "Pod", "--bound-object-name", pod]
    return c.kubectl(*args).strip()


async def get(url: str, t: str | None) -> tuple[int, bytes]:
    headers = {} if t is None else {"Authorization": f"Bearer {t}"}
    async with aiohttp.ClientSession() as s, s.get(url, headers=headers) as resp:
        return resp.status, await resp.read()


async def test_only_an_agents_pod_bound_token_for_the_cache_gets_anything(
    cluster: Kubectl, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    c = cluster
    c.kubectl("create", "serviceaccount", "trainer", "-n", "ml")
    c.apply(pod_on("node-b", "trainer-0", "ml", "trainer"))
    agent = token(c, "tidelease-agent", "agent-node-a")  # the reviewer: the agent's own token
    kubeconfig = write_kubeconfig(
        tmp_path / "kubeconfig", c.apiserver.server, agent, c.apiserver.ca
    )
    api = await KubeClient.connect(kubeconfig)
    store = CacheStore(tmp_path / "cache", max_bytes=1 << 30, piece_size=64 << 10)
    source = random_file(tmp_path / "src.bin", 200_000)
    store.add_file(Kind.CHECKPOINT, CKPT, source)
    data = source.read_bytes()
    verifier = TokenReviewVerifier(
        api, audience=DEFAULT_AUDIENCE, user=service_account_user(NS, "tidelease-agent")
    )
    node = await start_peer(store, verifier)
    try:
        presented = {
            "none": None,
            "api-audience-agent-on-b": issued(
                c, "tidelease-agent", NS, audience=None, pod="agent-node-b"
            ),
            "workload-on-b": issued(c, "trainer", "ml", audience=DEFAULT_AUDIENCE, pod="trainer-0"),
            "agent-not-bound": issued(
                c, "tidelease-agent", NS, audience=DEFAULT_AUDIENCE, pod=None
            ),
            "other-audience-agent-on-b": issued(
                c, "tidelease-agent", NS, audience="vault", pod="agent-node-b"
            ),
        }
        expected = {
            "none": 401,
            "api-audience-agent-on-b": 401,
            "workload-on-b": 403,
            "agent-not-bound": 403,
            "other-audience-agent-on-b": 401,
        }
        for name, t in presented.items():
            for path in ("/v1/inventory", f"/v1/checkpoints/{CKPT}/manifest",
                         f"/v1/checkpoints/{CKPT}/data"):  # fmt: skip
                status, body = await get(node.url + path, t)
                assert status == expected[name], (name, path, status, body[:200])
                assert CKPT.encode() not in body, (name, path)
                assert data[:64] not in body, (name, path)
        peer_b = issued(c, "tidelease-agent", NS, audience=DEFAULT_AUDIENCE, pod="agent-node-b")
        with caplog.at_level(logging.INFO, logger="nodeagent.cache.peerserver"):
            assert await get(node.url + "/v1/inventory", peer_b) == (
                200,
                b'{"checkpoints": ["job-a.step-7"], "images": []}',
            )
            assert await get(node.url + f"/v1/checkpoints/{CKPT}/data", peer_b) == (200, data)
        assert "to node node-b" in caplog.text
        assert "pod agent-node-b" in caplog.text
    finally:
        await node.stop()
        await api.close()
        c.kubectl("delete", "pod", "trainer-0", "-n", "ml", "--grace-period=0", "--force",
                  "--ignore-not-found", "--wait=false")  # fmt: skip
        c.kubectl("delete", "serviceaccount", "trainer", "-n", "ml", "--ignore-not-found")
