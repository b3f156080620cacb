"""A real kube-apiserver and etcd (hack/apiserver.sh) for the tests of the API-server client."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.background import running

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class ApiServer:
    kubeconfig: Path
    server: str
    token: str
    ca: Path
    dir: Path  # the control plane's directory (etcd's data, the logs)


@pytest.fixture(scope="session")
def apiserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    state = tmp_path_factory.mktemp("apiserver") / "state.env"
    with running(
        [str(ROOT / "hack" / "apiserver.sh"), str(state)],
        state=state,
        log=state.with_suffix(".log"),
        what="hack/apiserver.sh",
        start_timeout_s=180,
        stop_timeout_s=30,
    ) as facts:
        yield ApiServer(
            Path(facts["KUBECONFIG"]),
            facts["SERVER"],
            facts["TOKEN"],
            Path(facts["CA"]),
            Path(facts["DIR"]),
        )
