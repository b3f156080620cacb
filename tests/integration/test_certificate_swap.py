"""A serving certificate of eight seconds and a client certificate of twelve, renewed by the
rotation (extender/certrotation, over the fake Secrets) at two thirds of their life, written as
the kubelet writes a Secret volume, followed by the extender's TLS listener, while a client
with kube-scheduler's client certificate opens a new connection every 20 ms: not one call
fails, and the test outlives the first certificates (tests/certswap.py)."""

from __future__ import annotations

from pathlib import Path

from extender.certrotation.testing import FakeSecrets
from tests.certswap import assert_renewed_without_a_failed_call, swap


async def test_certificates_renewed_before_they_end_are_served_without_a_failed_call(
    tmp_path: Path,
) -> None:
    assert_renewed_without_a_failed_call(await swap(FakeSecrets(), tmp_path))
