"""The pod-annotation ValidatingAdmissionPolicy, judged by the real API server: on a table of
valid and invalid values it refuses exactly the pods the extender's filter refuses, with the
filter's message (both come from common.annotationrules)."""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from common import admissionpolicy, builders, contract
from common.errors import Conflict, InvalidInput, NotFound
from common.kubeclient import KubeClient
from common.podrequest import parse_pod
from tests.apiserver.conftest import ApiServer
from tests.polling import eventually

pytestmark = pytest.mark.apiserver

VAP = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies"
BINDINGS = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings"
PIN = "sha256:" + "0123456789abcdef" * 4

PRI, REL, RCL = contract.ANN_PRIORITY, contract.ANN_RELIABILITY, contract.ANN_RECLAIM
JOB, ELA, TPT = contract.ANN_JOB_CLASS, contract.ANN_ELASTIC, contract.ANN_THROUGHPUT
OWN, GPU, CKP = contract.ANN_OWNER, contract.ANN_GPU_TYPE, contract.ANN_CHECKPOINT
WKL, MAX = contract.ANN_WORKLOAD, contract.ANN_MAX_REPLICAS

TABLE: list[dict[str, str]] = [
    {PRI: "high", OWN: "recsys"},
    {PRI: "low"},
    {PRI: "urgent"},
    {PRI: "High"},
    {PRI: ""},
    {PRI: "ürgent"},
    {REL: "HA"},
    {REL: "ha"},
    {REL: "XA", PRI: "nope"},
    {RCL: "true", PRI: "high", OWN: "recsys"},
    {RCL: "true"},
    {RCL: "true", PRI: "high"},
    {RCL: "true", PRI: "high", OWN: "Bad_Owner"},
    {RCL: "yes"},
    {RCL: "false"},
    {JOB: "interactive"},
    {JOB: " Interactive\t"},
    {JOB: "\u00a0BATCH\u2003"},
    {JOB: "\x1cbatch"},
    {JOB: "queue"},
    {ELA: "false"},
    {ELA: "TRUE"},
    {ELA: "no"},
    {TPT: "100,190,270"},
    {TPT: "100, 190.5 ,2e3,.5,7."},
    {TPT: "1e100"},
    {TPT: "-5"},
    {TPT: "nan"},
    {TPT: "inf"},
    {TPT: ""},
    {TPT: "1,,2"},
    {TPT: "1_000"},
    {OWN: "recsys"},
    {OWN: "a" * 253},
    {OWN: "a" * 254},
    {OWN: "Job_A"},
    {OWN: "-job"},
    {OWN: "job.v2"},
    {GPU: "H20"},
    {GPU: "NVIDIA-H100-80GB"},
    {GPU: "H20 SXM"},
    {GPU: "-x"},
    {GPU: "x" * 64},
    {CKP: "ck-1"},
    {CKP: f"ck-1@{PIN}"},
    {CKP: f"ck-1@{PIN.upper().replace('SHA256', 'sha256')}"},
    {CKP: "ck@md5:abc"},
    {CKP: f"@{PIN}"},
    {CKP: "a@b@c"},
    {CKP: ""},
    {CKP: "it's"},
    {PRI: "x", REL: "y", RCL: "z", JOB: "w", ELA: "v", TPT: "u", OWN: "T", GPU: " ", CKP: "@"},
    {"tidelease.io/hot-restart": "true"},
    {WKL: "Deployment/train", MAX: "6"},
    {WKL: "StatefulSet/db.v2", MAX: "10000"},
    {WKL: "Job/train", MAX: "0"},
    {WKL: "Deployment/Train", MAX: "10001"},
    {WKL: "Deployment/", MAX: "06"},
    {MAX: "12"},
]


def pod(ns: str, annotations: dict[str, str]) -> dict[str, Any]:
    obj = builders.pod("p-" + uuid.uuid4().hex[:8], 1, namespace=ns)
    obj["metadata"].pop("uid")
    obj["metadata"]["annotations"] = annotations
    obj.pop("status")
    return obj


def filter_says(ns: str, annotations: dict[str, str]) -> str | None:
    """The filter's verdict on the pod: its problems joined as it joins them, or None."""
    obj = pod(ns, annotations)
    obj["metadata"]["uid"] = "u"  # as the API server gives it
    try:
        parse_pod(obj)
    except InvalidInput as e:
        return str(e)
    return None


async def admission_says(kube: KubeClient, ns: str, annotations: dict[str, str]) -> str | None:
    """The API server's verdict on creating the pod: the policy's message, or None."""
    resp = await kube.raw(
        "POST", f"/api/v1/namespaces/{ns}/pods", query={"dryRun": "All"}, body=pod(ns, annotations)
    )
    try:
        status = json.loads(await resp.read())
    finally:
        resp.release()
    if resp.status == 201:
        return None
    assert resp.status == 422, status  # reason Invalid: a 4xx the author can act on
    prefix = (
        f"ValidatingAdmissionPolicy '{admissionpolicy.POLICY_NAME}' with binding "
        f"'{admissionpolicy.POLICY_NAME}' denied request: "
    )
    message = str(status["message"])
    assert prefix in message, message
    return message.split(prefix, 1)[1]


@pytest.fixture
async def kube(apiserver: ApiServer) -> AsyncIterator[KubeClient]:
    """A client; the policy and binding the test installs are removed after it (the chart's
    install in other tests makes its own, and no other test's pods are judged by it)."""
    kube = await KubeClient.connect(apiserver.kubeconfig)
    try:
        yield kube
    finally:
        for path in (BINDINGS, VAP):
            with contextlib.suppress(NotFound):
                await kube.json("DELETE", f"{path}/{admissionpolicy.POLICY_NAME}")
        await kube.close()


async def install_policy(kube: KubeClient, ns: str) -> None:
    """The generated policy and binding, once the API server enforces them."""
    policy, binding = admissionpolicy.objects()
    for path, obj in ((VAP, policy), (BINDINGS, binding)):
        with contextlib.suppress(Conflict):
            await kube.json("POST", path, body=obj)
    got = await kube.json("GET", f"{VAP}/{admissionpolicy.POLICY_NAME}")
    assert not (got.get("status") or {}).get("typeChecking", {}).get("expressionWarnings"), got

    async def enforced() -> bool:
        return await admission_says(kube, ns, {PRI: "urgent"}) is not None

    await eventually(enforced, within_s=30)


async def with_policy(kube: KubeClient) -> str:
    """A namespace of the test's own, once the policy is enforced in it."""
    ns = f"vap-{uuid.uuid4().hex[:6]}"
    await kube.json("POST", "/api/v1/namespaces", body={"metadata": {"name": ns}})
    await install_policy(kube, ns)
    return ns


async def test_the_api_server_refuses_what_the_filter_refuses_with_its_message(
    kube: KubeClient,
) -> None:
    ns = await with_policy(kube)
    refused = 0
    for values in TABLE:
        want = filter_says(ns, values)
        got = await admission_says(kube, ns, values)
        assert got == want, values
        refused += want is not None
    # The table is not all one way.
    assert 20 < refused < len(TABLE) - 15, refused


async def test_a_value_with_a_line_break_is_refused_with_the_fallback_message(
    kube: KubeClient,
) -> None:
    """The API server drops a message with a line break; the pod is refused all the same."""
    ns = await with_policy(kube)
    assert filter_says(ns, {OWN: "recsys\n"}) is not None
    assert await admission_says(kube, ns, {OWN: "recsys\n"}) == admissionpolicy.FALLBACK_MESSAGE
