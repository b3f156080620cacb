"""The queues' release proof (common/queuerelease.py): which pods the extender may place, the
pods the queues controller takes as still waiting (extender.queues.admission.observe), and the
key read from its file (common/keyfile.py) through the settings."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from common import builders, contract
from common.errors import InvalidInput
from common.keyfile import MIN_KEY_LENGTH, KeyFile
from common.queuerelease import release_problem, release_proof
from extender.queues.admission import observe
from extender.scheduler.settings import load_settings

KEY = b"k" * MIN_KEY_LENGTH
OTHER_KEY = b"o" * MIN_KEY_LENGTH
UID = "0b9c6e0e-5c39-4d5e-9a53-3f1f7e0d2a11"
CLASS = {contract.ANN_JOB_CLASS: "batch"}


def pod(annotations: dict[str, str], *, uid: str = UID, gate: bool = False) -> dict[str, Any]:
    obj = builders.pod("p", 2, namespace="ns", extra_annotations=annotations)
    obj["metadata"]["uid"] = uid
    obj["status"] = {"phase": "Pending"}
    if gate:
        obj["spec"]["schedulingGates"] = [{"name": contract.SCHEDULING_GATE}]
    return obj


def proved(key: bytes = KEY, uid: str = UID) -> dict[str, str]:
    return {**CLASS, contract.ANN_QUEUE_RELEASED: release_proof(key, uid)}


@pytest.mark.parametrize(
    ("obj", "key", "problem"),
    [
        (pod({}), KEY, None),
        (pod(CLASS), None, None),
        (pod(proved()), KEY, None),
        (pod(CLASS), KEY, "gate tidelease.io/queue was removed or never set"),
        (pod({**CLASS, contract.ANN_QUEUE: "1"}), KEY, "not released by the queues controller"),
        (pod(proved(OTHER_KEY)), KEY, "annotation is not the queues controller's"),
        (pod(proved(uid="another-pod")), KEY, "annotation is not the queues controller's"),
        (pod({**CLASS, contract.ANN_QUEUE_RELEASED: "x"}), KEY, "is not the queues"),
        (pod(proved(), uid=""), KEY, "is not the queues"),
        (pod(proved()), b"", "release key is unreadable here"),
    ],
    ids=[
        "no-class-not-the-queues",
        "queues-off",
        "released-by-the-queues",
        "gate-removed-by-another",
        "queue-annotation-written-by-the-author",
        "proof-of-another-key",
        "proof-copied-from-another-pod",
        "proof-made-up",
        "no-uid",
        "key-unreadable-refuses-all",
    ],
)
def test_only_a_proof_of_the_queues_for_the_pods_own_uid_lets_it_be_placed(
    obj: dict[str, Any], key: bytes | None, problem: str | None
) -> None:
    got = release_problem(obj, key)
    if problem is None:
        assert got is None
    else:
        assert got is not None
        assert problem in got, got
        assert got.startswith("waiting for the shared queues to release it")
        assert "\n" not in got


def test_the_proof_is_urlsafe_fixed_and_needs_a_key() -> None:
    proof = release_proof(KEY, UID)
    assert proof == release_proof(KEY, UID)
    assert len(proof) == 43
    assert set(proof) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
    assert proof not in (release_proof(OTHER_KEY, UID), release_proof(KEY, UID + "x"))
    with pytest.raises(ValueError, match="needs a key"):
        release_proof(b"", UID)


@pytest.mark.parametrize(
    ("annotations", "gate", "key", "waits"),
    [
        (CLASS, True, None, True),
        (CLASS, False, None, False),
        (CLASS, True, KEY, True),
        (CLASS, False, KEY, True),
        (proved(), False, KEY, False),
        (proved(OTHER_KEY), False, KEY, True),
    ],
    ids=[
        "gated-without-key",
        "ungated-without-key-is-not-held",
        "gated-with-key",
        "gate-removed-by-another-waits",
        "released-with-proof",
        "forged-proof-waits",
    ],
)
def test_the_queues_hold_a_pending_pod_without_a_proof_as_a_gated_one(
    annotations: dict[str, str], gate: bool, key: bytes | None, waits: bool
) -> None:
    jobs = observe([pod(annotations, gate=gate)], contract.DEFAULT_GPU_RESOURCE, key)
    ((p,),) = [j.pods for j in jobs.values()]
    assert p.gated is waits


def test_a_placed_pod_without_a_proof_is_not_held() -> None:
    """Pods placed before the queues had a key (an upgrade) keep running as they are."""
    obj = pod(CLASS)
    obj["spec"]["nodeName"] = "n1"
    obj["status"] = {"phase": "Running"}
    ((p,),) = [j.pods for j in observe([obj], contract.DEFAULT_GPU_RESOURCE, KEY).values()]
    assert not p.gated


def test_the_settings_read_the_key_and_again_once_it_changes(tmp_path: Path) -> None:
    f = tmp_path / "key"
    f.write_bytes(KEY + b"\n")
    settings = load_settings(env={"TIDELEASE_EXTENDER_QUEUE_RELEASE_KEY_FILE": str(f)})
    assert settings.queue_release_key() == KEY
    assert load_settings(env={}).queue_release_key() is None
    f.write_bytes(OTHER_KEY)
    os.utime(f, ns=(1, 1))  # a changed mtime, whatever the file system's resolution
    assert settings.queue_release_key() == OTHER_KEY


def test_a_short_or_missing_key_keeps_the_last_or_refuses(tmp_path: Path) -> None:
    f = tmp_path / "key"
    f.write_bytes(b"short")
    keys = KeyFile(f)
    assert keys.key() == b""  # none yet: every pod of the queues waits
    f.write_bytes(KEY)
    os.utime(f, ns=(2, 2))
    assert keys.key() == KEY
    f.unlink()
    assert keys.key() == KEY  # a Secret being swapped: the last good key


def test_a_key_file_that_is_not_there_is_a_settings_problem(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match=r"queue_release_key_file .* is not a file"):
        load_settings(env={"TIDELEASE_EXTENDER_QUEUE_RELEASE_KEY_FILE": str(tmp_path / "no")})
