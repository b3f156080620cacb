"""The chart's HTTPS for the clusterScheduler mode (templates/extender-tls.yaml): certificates
made by the chart or by cert-manager, the extender and the scheduler configuration pointing at
them, and the chart-made ones working together in a real TLS handshake."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ssl
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web
from prometheus_client import CollectorRegistry

from common.httpserving import Limits, ServerTLS, TLSContext, listen
from extender.certrotation.controller import Rotation, RotationMetrics, load_rotation_settings
from extender.certrotation.testing import FakeSecrets
from tests.chart import CHART, NAMESPACE, containers, find, helm, kube_version

CLUSTER = "scheduling.mode=clusterScheduler"
SVC = f"tidelease-extender.{NAMESPACE}.svc"


def render(*values: str, api_versions: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    args = [a for v in values for a in ("--set", v)]
    args += [a for v in api_versions for a in ("--api-versions", v)]
    out = helm(
        "template", "tidelease", str(CHART), "--namespace", NAMESPACE,
        "--kube-version", kube_version(), *args,
    ).stdout  # fmt: skip
    return [d for d in yaml.safe_load_all(out) if d]


def secret_files(objs: list[dict[str, Any]], name: str, into: Path) -> dict[str, Path]:
    into.mkdir(parents=True, exist_ok=True)
    data = find(objs, "Secret", name)["data"]
    out = {}
    for key, value in data.items():
        (into / key).write_bytes(base64.b64decode(value))
        out[key] = into / key
    return out


def openssl(*args: str) -> str:
    done = subprocess.run(["openssl", *args], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def scheduler_extender(objs: list[dict[str, Any]]) -> dict[str, Any]:
    config = yaml.safe_load(
        find(objs, "ConfigMap", "tidelease-scheduler-config")["data"]["config.yaml"]
    )
    (extender,) = config["extenders"]
    return dict(extender)


@pytest.mark.parametrize(
    "values",
    [
        pytest.param((), id="ownScheduler"),
        pytest.param((CLUSTER,), id="clusterScheduler"),
        pytest.param((CLUSTER, "extender.tls.certManager=true"), id="cert-manager"),
        pytest.param((CLUSTER, "extender.controllers.queues=true"), id="queues"),
    ],
)
def test_helm_template_renders_the_same_twice(values: tuple[str, ...]) -> None:
    """GitOps tools render with `helm template`: nothing random, nothing made at render time."""
    args = [a for v in values for a in ("--set", v)]

    def once() -> str:
        return helm(
            "template", "tidelease", str(CHART), "--namespace", NAMESPACE,
            "--kube-version", kube_version(), *args,
        ).stdout  # fmt: skip

    assert once() == once()


def test_the_chart_makes_no_certificate_and_has_the_controllers_make_them() -> None:
    objs = render(CLUSTER)
    assert not [o for o in objs if o["kind"] == "Secret" and "extender" in o["metadata"]["name"]]
    for obj in objs:
        assert obj["apiVersion"] != "cert-manager.io/v1"
    config = yaml.safe_load(
        find(objs, "ConfigMap", "tidelease-certificates")["data"]["certificates.yaml"]
    )
    assert config["namespace"] == NAMESPACE
    assert SVC in config["dnsNames"]
    assert f"{SVC}.cluster.local" in config["dnsNames"]
    assert (config["caValidityDays"], config["servingValidityDays"]) == (3650, 90)
    ctl = containers(find(objs, "Deployment", "tidelease-controllers"))["controllers"]
    assert "--certificates=/etc/tidelease/certificates/certificates.yaml" in ctl["args"]
    rules = find(objs, "Role", "tidelease-controllers")["rules"]
    secrets = [r for r in rules if "secrets" in r["resources"]]
    assert {"verbs": ["get", "update"], "resourceNames": sorted(r for r in (
        "tidelease-extender-ca", "tidelease-extender-tls", "tidelease-scheduler-client"))} in [
        {"verbs": r["verbs"], "resourceNames": sorted(r.get("resourceNames", []))} for r in secrets
    ]  # fmt: skip
    # The scheduler checks the serving certificate against the Service name, whatever URL.
    extender = scheduler_extender(objs)
    assert extender["enableHTTPS"] is True
    assert extender["urlPrefix"] == f"https://{SVC}:8888"
    assert extender["tlsConfig"] == {
        "serverName": SVC,
        "certFile": "/etc/kubernetes/tidelease/tls.crt",
        "keyFile": "/etc/kubernetes/tidelease/tls.key",
        "caFile": "/etc/kubernetes/tidelease/ca.crt",
    }
    settings = yaml.safe_load(
        find(objs, "ConfigMap", "tidelease-extender-settings")["data"]["settings.yaml"]
    )
    assert settings["client_names"] == ["tidelease-scheduler-client"]


def test_the_extender_serves_https_from_the_secret_and_requires_the_client_ca() -> None:
    objs = render(CLUSTER)
    settings = yaml.safe_load(
        find(objs, "ConfigMap", "tidelease-extender-settings")["data"]["settings.yaml"]
    )
    assert settings["metrics_auth"] is True
    deployment = find(objs, "Deployment", "tidelease-extender")
    extender = containers(deployment)["extender"]
    tls = [a for a in extender["args"] if a.startswith(("--tls-", "--client-ca"))]
    assert tls == [
        "--tls-cert-file=/etc/tidelease/tls/tls.crt",
        "--tls-key-file=/etc/tidelease/tls/tls.key",
        "--client-ca-file=/etc/tidelease/tls/ca.crt",
    ]
    mounts = extender["volumeMounts"]
    assert {"name": "tls", "mountPath": "/etc/tidelease/tls", "readOnly": True} in mounts
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == "tidelease-extender-tls"
    assert deployment["spec"]["template"]["spec"]["securityContext"]["fsGroup"] == 65532
    # The controllers read the same settings file, without the extender's certificates.
    ctl = containers(find(objs, "Deployment", "tidelease-controllers"))["controllers"]
    assert not [a for a in ctl["args"] if "tls" in a]


def test_own_scheduler_mode_has_no_certificates_and_plain_loopback() -> None:
    objs = render()
    assert not [o for o in objs if o["kind"] == "Secret" and "extender" in o["metadata"]["name"]]
    extender = scheduler_extender(objs)
    assert extender["enableHTTPS"] is False
    assert "tlsConfig" not in extender
    args = containers(find(objs, "Deployment", "tidelease-extender"))["extender"]["args"]
    assert not [a for a in args if a.startswith("--tls-")]


def test_cert_manager_makes_them_when_the_cluster_serves_it() -> None:
    objs = render(CLUSTER, api_versions=("cert-manager.io/v1",))
    made = {
        (o["kind"], o["metadata"]["name"]) for o in objs if o["apiVersion"] == "cert-manager.io/v1"
    }
    assert made == {
        ("Issuer", "tidelease-selfsigned"),
        ("Certificate", "tidelease-extender-ca"),
        ("Issuer", "tidelease-extender-ca"),
        ("Certificate", "tidelease-extender-tls"),
        ("Certificate", "tidelease-scheduler-client"),
    }
    assert not [o for o in objs if o["kind"] == "Secret" and "extender" in o["metadata"]["name"]]
    serving = find(objs, "Certificate", "tidelease-extender-tls")["spec"]
    assert serving["secretName"] == "tidelease-extender-tls"
    assert SVC in serving["dnsNames"]
    assert serving["usages"] == ["server auth", "digital signature"]
    client = find(objs, "Certificate", "tidelease-scheduler-client")["spec"]
    assert client["usages"] == ["client auth", "digital signature"]
    assert (client["duration"], client["renewBefore"]) == ("8760h", "2920h")
    assert (serving["duration"], serving["renewBefore"]) == ("2160h", "720h")
    # Asked not to, the controllers make them even where cert-manager is served.
    own = render(CLUSTER, "extender.tls.certManager=false", api_versions=("cert-manager.io/v1",))
    assert not [o for o in own if o["apiVersion"] == "cert-manager.io/v1"]
    find(own, "ConfigMap", "tidelease-certificates")


async def test_kube_schedulers_files_pass_the_extenders_tls(tmp_path: Path) -> None:
    """The certificates the rotation makes, in a real handshake as kube-scheduler makes it: its
    client certificate, the extender's CA, the Service name as serverName; another install's
    client certificate (another CA) refused."""
    config = yaml.safe_load(
        find(render(CLUSTER), "ConfigMap", "tidelease-certificates")["data"]["certificates.yaml"]
    )
    (tmp_path / "certificates.yaml").write_text(yaml.safe_dump(config))
    settings = load_rotation_settings(tmp_path / "certificates.yaml")

    async def made(into: Path) -> tuple[dict[str, Path], dict[str, Path]]:
        secrets = FakeSecrets()
        await Rotation(secrets, settings, RotationMetrics.create(CollectorRegistry())).step()
        out = []
        for name in ("tidelease-extender-tls", "tidelease-scheduler-client"):
            (into / name).mkdir(parents=True)
            files = {}
            for key, value in secrets.data[name].items():
                (into / name / key).write_bytes(value)
                files[key] = into / name / key
            out.append(files)
        return out[0], out[1]

    serving, client = await made(tmp_path / "ours")
    _, stranger = await made(tmp_path / "theirs")

    async def ok(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/", ok)
    runner = web.AppRunner(app)
    await runner.setup()
    tls = TLSContext(
        ServerTLS(
            serving["tls.crt"],
            serving["tls.key"],
            serving["ca.crt"],
            ("tidelease-scheduler-client",),
        )
    )
    try:
        await listen(runner, "127.0.0.1", 0, limits=Limits(), tls=tls)
        port = runner.addresses[0][1]

        async def get(files: dict[str, Path]) -> bytes:
            context = ssl.create_default_context(cafile=str(client["ca.crt"]))
            context.load_cert_chain(str(files["tls.crt"]), str(files["tls.key"]))
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", port, ssl=context, server_hostname=SVC
            )
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            try:
                return await asyncio.wait_for(reader.read(), 5)
            finally:
                writer.close()

        assert (await get(client)).endswith(b"ok")
        refused = b""
        with contextlib.suppress(ssl.SSLError, ConnectionError):
            refused = await get(stranger)
        assert not refused.endswith(b"ok")
    finally:
        await runner.cleanup()
