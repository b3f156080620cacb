"""The soak's scheduling shape: two replicas as the chart's ownScheduler mode runs them, each a
kube-scheduler calling an extender of its own, the kube-schedulers leader-elected; both
extenders reach the API server through a fault proxy (tests/e2e/forwarding.py) that the
network faults slow down or make drop replies.

hack/cluster-up.sh starts one kube-scheduler (profile ``default-scheduler``, no leader election)
calling one extender. :func:`take_over` turns that into two replicas: the extender is started
again with a kubeconfig whose server is the proxy, a second extender is started beside it
(its own verb and probe ports, same certificates and account), the first kube-scheduler is
started again with leader election on, and a second one with the same configuration but the
second extender's URL. Leader election is compressed as the tides are (a lease of
:data:`LEASE_S`): a replica killed while it leads is replaced by the other within seconds.
"""

from __future__ import annotations

import contextlib
import ssl
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import yaml

from tests.e2e.forwarding import Forwarder, forwarding
from tests.ports import free_port
from tests.processes import Processes

REPLICAS = 2
LEASE_S, RENEW_S, RETRY_S = 6, 4, 1  # the kube-schedulers' leader election (chart: 15, 10, 2)


def extender(i: int) -> str:
    return f"extender-{i}"


def scheduler(i: int) -> str:
    return f"kube-scheduler-{i}"


@dataclass
class Replicas:
    """The two replicas' processes (roles :func:`extender` and :func:`scheduler`) and the
    proxy between the extenders and the API server."""

    processes: Processes
    proxy: Forwarder
    metrics_urls: dict[int, str]  # replica -> its kube-scheduler's /metrics

    def leader(self) -> int | None:
        """The replica whose kube-scheduler leads now (its ``leader_election_master_status``
        is 1), or None when neither says so."""
        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE  # its self-signed serving certificate, on loopback
        for i, url in self.metrics_urls.items():
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(url, context=insecure, timeout=2) as resp:
                    text = resp.read().decode()
                for line in text.splitlines():
                    if line.startswith("leader_election_master_status") and line.endswith(" 1"):
                        return i
        return None


def _scheduler_config(src: Path, out: Path, extender_url: str) -> None:
    cfg = yaml.safe_load(src.read_text())
    cfg["leaderElection"] = {
        "leaderElect": True,
        "leaseDuration": f"{LEASE_S}s",
        "renewDeadline": f"{RENEW_S}s",
        "retryPeriod": f"{RETRY_S}s",
        "resourceLock": "leases",
        "resourceNamespace": "kube-system",
        "resourceName": "kube-scheduler",
    }
    cfg["extenders"][0]["urlPrefix"] = extender_url
    out.write_text(yaml.safe_dump(cfg, sort_keys=False))


def _kubeconfig_via(src: Path, out: Path, port: int) -> None:
    cfg = yaml.safe_load(src.read_text())
    for cluster in cfg["clusters"]:
        cluster["cluster"]["server"] = f"https://127.0.0.1:{port}"
    out.write_text(yaml.safe_dump(cfg, sort_keys=False))


@contextlib.contextmanager
def take_over(
    processes: Processes, cluster_dir: Path, api_server: tuple[str, int]
) -> Iterator[Replicas]:
    """Two replicas from the cluster's one (``processes`` has the roles ``extender`` and
    ``kube-scheduler``, which this replaces by :func:`extender`/:func:`scheduler` 0 and 1);
    the proxy forwards until the block exits."""
    work = cluster_dir / "soak"
    work.mkdir(exist_ok=True)
    with forwarding("127.0.0.1", api_server) as proxy:
        ext = processes.specs.pop("extender")
        kubeconfig = work / "extender.kubeconfig"
        _kubeconfig_via(Path(ext.flag("kubeconfig")), kubeconfig, proxy.port)
        sched = processes.specs.pop("kube-scheduler")
        config = Path(sched.flag("config"))
        processes.kill("extender")
        processes.kill("kube-scheduler")
        del processes.pids["extender"], processes.pids["kube-scheduler"]
        metrics = {}
        for i in range(REPLICAS):
            port = ext.flag("port") if i == 0 else str(free_port())
            probe = ext.flag("probe-port") if i == 0 else str(free_port())
            spec = ext.with_flags(kubeconfig=str(kubeconfig), port=port, probe_port=probe)
            processes.start(extender(i), spec)
            mine = work / f"scheduler-{i}.yaml"
            _scheduler_config(config, mine, f"https://127.0.0.1:{port}")
            secure = sched.flag("secure-port") if i == 0 else str(free_port())
            certs = work / f"scheduler-{i}"
            certs.mkdir(exist_ok=True)
            processes.start(
                scheduler(i),
                sched.with_flags(config=str(mine), secure_port=secure, cert_dir=str(certs)),
            )
            metrics[i] = f"https://127.0.0.1:{secure}/metrics"
        yield Replicas(processes, proxy, metrics)
