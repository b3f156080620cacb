"""Leases on workloads whose replicas are groups of pods (a LeaderWorkerSet, or a CRD of that
kind): the scale counts groups, a scale-down lends the highest groups whole, and each pod of a
group takes back the very devices it lent."""

from __future__ import annotations

from dataclasses import replace

from common import builders
from common.model import Device
from common.tenancy import belongs, job_key
from extender.leasing.decisions import (
    OwnerPod,
    ScaleTo,
    SetTags,
    View,
    Wait,
    WriteStatus,
    decide,
    relabel,
    scale_up_groups,
)
from extender.rightofreturn.lease import (
    GpuLease,
    LeaseSpec,
    LeaseStatus,
    LentGroup,
    Workload,
    parse_gpu_lease,
)
from extender.rightofreturn.replicas import (
    incoming_replicas,
    member_name,
    names_replicas,
    replica_index,
)
from extender.rightofreturn.rules import replicas_to_release

LWS = "LeaderWorkerSet"
OWNER = job_key("default", "recsys")
NOW = 1_800_000_000.0


def lease(desired: int, status: LeaseStatus | None = None, name: str = "recsys") -> GpuLease:
    """Groups of a leader and one worker of 2 GPUs each: 4 GPUs per replica."""
    spec = LeaseSpec(OWNER, Workload("x.test/v1", LWS, name, "leaderworkersets"), 4, desired)
    return GpuLease("default", "recsys", "1", spec, status or LeaseStatus())


def group_pods(devs: list[Device], groups: int, name: str = "recsys") -> list[OwnerPod]:
    """Group g's leader on devs[4g:4g+2], its worker on devs[4g+2:4g+4]."""
    out = []
    for g in range(groups):
        for m, member in enumerate(("", "-1")):
            held = devs[4 * g + 2 * m : 4 * g + 2 * m + 2]
            out.append(
                OwnerPod(f"{name}-{g}{member}", f"uid-{g}{member}", held[0].node, uuids(held))
            )
    return out


def uuids(devs: list[Device]) -> tuple[str, ...]:
    return tuple(d.uuid for d in devs)


def world(lent: tuple[LentGroup, ...] = ()) -> tuple[list[Device], View]:
    """16 devices on nodes a and b; those of ``lent`` tagged with the owner and their group."""
    devs = builders.devices("a", 8) + builders.devices("b", 8)
    tags = {u: g.replica for g in lent for u in g.devices}
    devs = [
        replace(d, cls=d.cls._replace(owner=OWNER, replica=tags[d.uuid])) if d.uuid in tags else d
        for d in devs
    ]
    return devs, View({d.uuid: d for d in devs}, {}, {"a": True, "b": True})


def test_a_group_members_name_carries_its_group_whatever_the_workloads_name() -> None:
    assert [names_replicas(k) for k in (LWS, "StatefulSet", "Deployment", "JobSet")] == [
        True,
        True,
        False,
        False,
    ]
    assert replica_index(LWS, "recsys", "recsys-3") == 3
    assert replica_index(LWS, "recsys", "recsys-3-1") == 3
    # A workload named with a trailing number: the group is after the name, not the last part.
    assert replica_index(LWS, "gpt-2", "gpt-2-0-7") == 0
    assert replica_index(LWS, "gpt-2", "gpt-2-5") == 5
    assert replica_index(LWS, "recsys", "other-3") == -1
    assert replica_index(LWS, "recsys", "recsys-03") == -1
    assert replica_index("StatefulSet", "recsys", "recsys-3") == 3
    assert member_name(LWS, "recsys", "recsys-1-1", 4) == "recsys-4-1"
    assert member_name(LWS, "recsys", "recsys-1", 4) == "recsys-4"
    lent = ["recsys-1", "recsys-1-1", "recsys-2", "recsys-2-1", "recsys-3"]
    assert incoming_replicas(LWS, "recsys", 1, 3, lent) == tuple(lent[:4])
    assert incoming_replicas("StatefulSet", "recsys", 1, 3) == ("recsys-1", "recsys-2")
    assert incoming_replicas("Deployment", "recsys", 1, 3) is None


def test_a_scale_down_releases_the_highest_groups_whole() -> None:
    names = ["w-0", "w-0-1", "w-0-2", "w-1", "w-1-1", "w-1-2", "w-2", "w-2-1", "w-2-2"]
    index = lambda n: replica_index(LWS, "w", n)  # noqa: E731
    assert replicas_to_release(names, 1, index) == names[3:]
    assert replicas_to_release(names, 2, index) == names[6:]
    assert replicas_to_release(names, 3, index) == []
    # A StatefulSet: one pod a replica, as before.
    assert replicas_to_release(["s-2", "s-0", "s-1"], 1) == ["s-1", "s-2"]


def test_each_pod_of_a_lent_group_lends_and_takes_back_its_own_devices() -> None:
    devs, view = world()
    pods = group_pods(devs, 4)
    step = decide(lease(8), 4, pods, view, NOW)
    assert isinstance(step, WriteStatus)
    assert step.status.target_replicas == 2
    # Groups 2 and 3 go whole: four lent groups, each a pod's own devices.
    assert {g.replica: g.devices for g in step.status.groups} == {
        p.name: p.devices for p in pods[4:]
    }
    lent = step.status
    tagged = decide(lease(8, lent), 4, pods, view, NOW)
    assert isinstance(tagged, SetTags)
    assert {(c.uuid, c.replica) for c in tagged.changes} == {
        (u, p.name) for p in pods[4:] for u in p.devices
    }
    # Scale up one group: group 2's leader and worker take back their own, group 3's stay.
    steady = LeaseStatus(phase="Steady", target_replicas=2, groups=lent.groups)
    groups, back = scale_up_groups(lease(12, steady), 2, 3, view)
    assert groups == lent.groups
    assert {g.replica for g in back} == {"recsys-2", "recsys-2-1"}
    step = decide(lease(12, steady), 2, pods[:4], view, NOW)
    assert isinstance(step, WriteStatus)
    assert step.status.reclaiming == ("recsys-2", "recsys-2-1")


def test_a_reclaim_waits_for_every_pod_of_a_returning_group() -> None:
    devs, _ = world()
    pods = group_pods(devs, 3)
    lent = tuple(LentGroup(p.name, p.devices) for p in pods[4:])
    devs, view = world(lent)
    status = LeaseStatus(
        phase="Reclaiming",
        target_replicas=3,
        groups=lent,
        reclaim_started=NOW,
        reclaim_deadline=NOW,
        reclaiming=("recsys-2", "recsys-2-1"),
    )
    worker_pending = [*pods[:5], OwnerPod("recsys-2-1", "uid-2-1", "", ())]
    assert decide(lease(12, status), 3, worker_pending, view, NOW + 1) == Wait(
        NOW + 2, "2 of 3 replicas placed"
    )
    # The group's worker not created yet (its StatefulSet makes it after the leader): the
    # leader alone placed is not the group placed, nor half its devices back.
    assert decide(lease(12, status), 3, pods[:5], view, NOW + 1) == Wait(
        NOW + 2, "2 of 3 replicas placed"
    )
    step = decide(lease(12, status), 3, pods, view, NOW + 1)
    assert isinstance(step, WriteStatus)
    assert step.status.finalizing
    assert step.status.returned == 4
    assert decide(lease(12, status), 2, pods[:4], view, NOW + 1) == ScaleTo(3)


def test_a_group_still_lent_is_renamed_member_for_member() -> None:
    """Group 1 came back on group 3's devices: what stays lent is named for the groups still
    down, each pod's devices for the same member of that group."""
    g = [LentGroup(n, (f"u{i}",)) for i, n in enumerate(("w-1", "w-1-1", "w-3", "w-3-1"))]
    assert relabel(g, 2, LWS, "w") == (
        LentGroup("w-2", ("u0",)),
        LentGroup("w-2-1", ("u1",)),
        g[2],
        g[3],
    )


def test_a_substitute_group_has_as_many_devices_as_the_replicas_own() -> None:
    """Group 1's leader lent 2 devices, one now unhealthy; the only group that stays lent and
    comes back whole is a worker's of 1 device: the leader takes its own anyway."""
    devs, view = world()
    broken = devs[0]
    view = View(
        {**view.devices, broken.uuid: builders.devices("a", 1, healthy=False)[0]},
        {},
        view.offering,
    )
    status = LeaseStatus(
        phase="Steady",
        target_replicas=1,
        groups=(
            LentGroup("recsys-1", uuids(devs[0:2])),
            LentGroup("recsys-2-1", uuids(devs[8:9])),
        ),
    )
    groups, back = scale_up_groups(lease(8, status), 1, 2, view)
    assert groups == status.groups
    assert back == (status.groups[0],)


def test_a_leaderworkersets_own_statefulsets_control_its_pods() -> None:
    assert belongs(("StatefulSet", "recsys"), LWS, "recsys")
    assert belongs(("StatefulSet", "recsys-4"), LWS, "recsys")
    assert belongs((LWS, "recsys"), LWS, "recsys")
    assert not belongs(("StatefulSet", "recsys-x"), LWS, "recsys")
    assert not belongs(("StatefulSet", "recsys-4"), "StatefulSet", "recsys")
    assert not belongs(("ReplicaSet", "recsys-4"), LWS, "recsys")


def test_a_lease_names_the_resource_of_a_kind_whose_plural_is_not_regular() -> None:
    body = builders.gpu_lease("recsys", "default", gpus_per_replica=4, desired_gpus=8)
    body["spec"]["workload"] = {
        "apiVersion": "x.test/v1",
        "kind": "Policy",
        "name": "recsys",
        "resource": "policies",
    }
    workload = parse_gpu_lease(body).spec.workload
    assert workload.path("ml") == "/apis/x.test/v1/namespaces/ml/policies/recsys"
    del body["spec"]["workload"]["resource"]
    assert parse_gpu_lease(body).spec.workload.plural == "policys"
