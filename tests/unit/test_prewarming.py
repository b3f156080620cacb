"""Prewarming ahead of a predicted scale-up: which nodes, what, when, and when it is cleared.

The world: an online job ``recsys`` (4 GPUs per replica) scales 8 -> 16 GPUs at 08:00 UTC; two
replicas are down and lent their groups (recsys-2 on n1, recsys-3 on n2). Bandwidths as in
test_prelaunch (10 GB image at min(1.25, 0.5) GB/s = 20 s; 100 GB checkpoint at
min(1.25, 2) GB/s + 100 GB at 50 GB/s = 82 s), margin 120 s: a cold node has W = 82 s and
starts at 08:00 - 82 s - 120 s = 07:56:38; a node holding both has W = 2 s (the GPU load).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from common import builders, contract
from common.errors import InvalidInput
from common.model import (
    Device,
    GpuUuid,
    Holder,
    JobKey,
    NodeCache,
    NodeInventory,
    NodeName,
    PodRequest,
    PodUid,
    Priority,
    Tier,
)
from common.objects import gpu_node_object
from common.prelaunch import Bandwidths
from common.prewarmwire import (
    Directive,
    ItemStatus,
    directives_json,
    parse_directives,
    parse_items,
)
from extender.prewarm.policy import (
    PrewarmPlan,
    PrewarmSettings,
    WorkloadTemplate,
    changes,
    node_window,
    parse_workload,
    plan_prewarm,
)
from extender.rightofreturn.lease import GpuLease, Workload, parse_gpu_lease
from extender.scheduler.filtering import filter_nodes
from tests.unit.cluster import cluster

GB = 1e9
IMAGE = "registry.example/recsys:v7"
CKPT = "recsys-ckpt-42"
SETTINGS = PrewarmSettings(
    bandwidths=Bandwidths(net=1.25 * GB, registry=0.5 * GB, storage=2 * GB, gpu=50 * GB),
    margin_s=120.0,
    horizon_s=3600.0,
    spare_standby_replicas=1,
)
TEMPLATE = WorkloadTemplate(
    replicas=2, images=(IMAGE,), checkpoint=CKPT, image_bytes=10 * GB, checkpoint_bytes=100 * GB
)


def at(hhmmss: str) -> float:
    h, m, s = (int(x) for x in hhmmss.split(":"))
    return datetime(2025, 3, 10, h, m, s, tzinfo=UTC).timestamp()


T_SCALE = at("08:00:00")


def node(
    name: str,
    devs: Sequence[Device],
    *,
    images: Sequence[str] = (),
    checkpoints: Sequence[str] = (),
) -> NodeInventory:
    return NodeInventory(
        NodeName(name),
        tuple(devs),
        NodeCache(images=frozenset(images), checkpoints=frozenset(checkpoints)),
    )


def lent(name: str, **kw: Any) -> list[Device]:
    """Four devices lent by recsys (indices 4-7), beside four of the node's own."""
    return builders.devices(name, 4) + builders.devices(name, 4, owner="recsys", start=4, **kw)


def standby(name: str, *, tier: Tier = Tier.HA, gpu_type: str = "H20") -> list[Device]:
    return builders.devices(name, 4, standby=True, tier=tier, gpu_type=gpu_type)


def group_of(name: str) -> list[str]:
    return [builders.device_uuid(name, i) for i in range(4, 8)]


def lease(
    *,
    schedule: bool = True,
    desired: int = 16,
    status: dict[str, Any] | None = None,
    groups: dict[str, str] | None = None,
) -> GpuLease:
    groups = groups if groups is not None else {"recsys-2": "n1", "recsys-3": "n2"}
    spec = builders.gpu_lease_spec(
        "recsys",
        gpus_per_replica=4,
        desired_gpus=desired,
        schedule=[{"at": "08:00", "gpus": 16}, {"at": "22:00", "gpus": 8}] if schedule else None,
    )
    return parse_gpu_lease(
        {
            "metadata": {"namespace": "ml", "name": "recsys", "resourceVersion": "1"},
            "spec": spec,
            "status": {
                "phase": "Steady",
                "targetReplicas": 2,
                "lent": [{"replica": r, "devices": group_of(n)} for r, n in sorted(groups.items())],
                **(status or {}),
            },
        }
    )


def plan(
    nodes: Sequence[NodeInventory],
    now: float,
    *,
    leases: Sequence[GpuLease] | None = None,
    template: WorkloadTemplate | None = TEMPLATE,
    current: dict[str, tuple[Directive, ...]] | None = None,
    settings: PrewarmSettings = SETTINGS,
    holders: dict[GpuUuid, Holder] | None = None,
) -> PrewarmPlan:
    return plan_prewarm(
        leases if leases is not None else [lease()],
        {"ml/recsys": template},
        nodes,
        current or {},
        settings,
        now,
        holders,
    )


def prewarmed(p: PrewarmPlan) -> dict[str, Directive]:
    return {n: ds[0] for n, ds in p.by_node.items() if ds}


WARM = {"images": ["docker.io/x/other:v1", IMAGE], "checkpoints": [CKPT]}


# --- the prelaunch window from the node's cache state ---


@pytest.mark.parametrize(
    ("missing_images", "missing_ckpt", "window_s"),
    [
        pytest.param([IMAGE], True, 82.0, id="cold: the checkpoint is the bottleneck"),
        pytest.param([], False, 2.0, id="warm: only the GPU load"),
        pytest.param([IMAGE], False, 20.0, id="checkpoint cached: the image"),
        pytest.param([], True, 82.0, id="image cached: the checkpoint"),
    ],
)
def test_window_follows_the_cache_state(
    missing_images: list[str], missing_ckpt: bool, window_s: float
) -> None:
    w = node_window(TEMPLATE, missing_images, missing_ckpt, SETTINGS)
    assert w.window_s == pytest.approx(window_s)


def test_sizes_default_to_the_settings_and_no_checkpoint_costs_nothing() -> None:
    bare = WorkloadTemplate(replicas=1, images=(IMAGE,))
    assert node_window(bare, [IMAGE], True, SETTINGS).window_s == pytest.approx(20.0)
    no_images = WorkloadTemplate(replicas=1, images=(), checkpoint=CKPT)
    assert node_window(no_images, [], True, SETTINGS).window_s == pytest.approx(82.0)


# --- which nodes, what, when ---


def test_cold_node_starts_w_plus_margin_before_the_scale_up_and_a_warm_one_needs_nothing() -> None:
    nodes = [node("n1", lent("n1"), **WARM), node("n2", lent("n2")), node("s1", standby("s1"))]
    p = plan(nodes, at("07:30:00"))
    got = prewarmed(p)
    assert set(got) == {"n2"}  # n1 holds everything; no group is broken: no standby
    d = got["n2"]
    assert d.lease == "ml/recsys"
    assert d.role == "Lent"
    assert d.images == (IMAGE,)
    assert d.checkpoints == (CKPT,)
    assert d.deadline == T_SCALE
    assert d.window_s == pytest.approx(82.0)
    assert d.not_before == pytest.approx(at("07:56:38"))
    (lp,) = p.leases
    assert lp.scale_up is not None
    assert (lp.scale_up.replicas_now, lp.scale_up.replicas_target) == (2, 4)
    why = {n.node: (n.window.window_s, n.why) for n in lp.nodes}
    assert why["n1"][0] == pytest.approx(2.0)
    assert "holds everything already" in why["n1"][1]


def test_a_cold_node_starts_earlier_than_one_missing_only_the_image() -> None:
    nodes = [
        node("n1", lent("n1"), checkpoints=[CKPT]),  # lacks the image: W = 20 s
        node("n2", lent("n2")),  # cold: W = 82 s
    ]
    got = prewarmed(plan(nodes, at("07:30:00")))
    assert got["n1"].images == (IMAGE,)
    assert got["n1"].checkpoints == ()
    assert got["n1"].not_before == pytest.approx(T_SCALE - 20 - 120)
    assert got["n2"].not_before == pytest.approx(T_SCALE - 82 - 120)
    assert got["n2"].not_before < got["n1"].not_before


def test_images_compare_as_runtimes_report_them() -> None:
    template = WorkloadTemplate(replicas=2, images=("app:v1",), checkpoint=None)
    nodes = [
        node("n1", lent("n1"), images=["docker.io/library/app:v1"]),
        node("n2", lent("n2")),
    ]
    got = prewarmed(plan(nodes, at("07:59:00"), template=template))
    assert set(got) == {"n2"}
    assert got["n2"].images == ("app:v1",)


def test_nothing_before_the_horizon() -> None:
    nodes = [node("n1", lent("n1")), node("n2", lent("n2"))]
    # 07:56:38 - 3600 s = 06:56:38
    assert prewarmed(plan(nodes, at("06:56:00"))) == {}
    assert set(prewarmed(plan(nodes, at("06:57:00")))) == {"n1", "n2"}


def test_a_broken_group_is_covered_by_standby_of_its_type_and_tier_with_a_margin() -> None:
    n2 = lent("n2")
    n2[5] = Device(n2[5].node, 5, n2[5].uuid, n2[5].cls._replace(healthy=False))
    nodes = [
        node("n1", lent("n1"), **WARM),
        node("n2", n2),
        node("s1", standby("s1")),  # cold
        node("s2", standby("s2"), **WARM),  # warm: chosen first, nothing to fetch
        node("s3", standby("s3", tier=Tier.MA)),  # tier too low
        node("s4", standby("s4", gpu_type="H100")),  # wrong type
        node("s5", standby("s5")),  # a third one is not needed
    ]
    p = plan(nodes, at("07:50:00"))
    got = prewarmed(p)
    assert set(got) == {"s1"}
    assert got["s1"].role == "Standby"
    assert got["s1"].not_before == pytest.approx(at("07:56:38"))
    chosen = {n.node for n in p.leases[0].nodes}
    # n2's group cannot come back: 1 replica + 1 spare from standby (s2 warm, then s1)
    assert chosen == {"n1", "s1", "s2"}


def test_standby_nodes_are_ranked_as_the_filter_will_send_the_stand_in() -> None:
    """The better tier wins over the exact one, even cold: the extender's filter sends the
    reclaim pod to the standby devices of the best tiers (filtering.return_share)."""
    n2 = lent("n2", tier=Tier.MA)
    n2[5] = Device(n2[5].node, 5, n2[5].uuid, n2[5].cls._replace(healthy=False))
    spares = [
        node("s-ma", standby("s-ma", tier=Tier.MA), **WARM),  # exact tier, holds the data
        node("s-ha", standby("s-ha", tier=Tier.HA)),  # better tier, cold
    ]
    nodes = [node("n1", lent("n1", tier=Tier.MA), **WARM), node("n2", n2), *spares]
    p = plan(nodes, at("07:50:00"), settings=replace(SETTINGS, spare_standby_replicas=0))
    assert [n.node for n in p.leases[0].nodes if n.role == "Standby"] == ["s-ha"]
    # The filter agrees: of the standby nodes, it passes only that one.
    state = cluster(*(gpu_node_object(n) for n in spares))
    stand_in = PodRequest(
        "ml",
        "recsys-3",
        PodUid("uid-recsys-3"),
        4,
        Priority.HIGH,
        owner=JobKey("recsys"),
        min_tier=Tier.MA,
        gpu_type="H20",
        reclaim=True,
    )
    assert filter_nodes(state, stand_in, ["s-ma", "s-ha"]).passed == ["s-ha"]


def test_standby_devices_held_already_are_not_counted() -> None:
    n2 = lent("n2")
    n2[5] = Device(n2[5].node, 5, n2[5].uuid, n2[5].cls._replace(healthy=False))
    nodes = [node("n1", lent("n1"), **WARM), node("n2", n2), node("s1", standby("s1"), **WARM)]
    busy = {
        builders.device_uuid("s1", i): Holder(
            PodUid("uid-other-0"), "ml", "other-0", Priority.HIGH, 0, JobKey("other")
        )
        for i in range(2)
    }
    p = plan(nodes, at("07:50:00"), holders=busy)
    assert [n.node for n in p.leases[0].nodes if n.role == "Standby"] == []
    assert [n.node for n in plan(nodes, at("07:50:00")).leases[0].nodes if n.role == "Standby"] == [
        "s1"
    ]


def test_a_group_on_a_node_gone_is_backfilled_by_the_type_of_the_other_lent_devices() -> None:
    nodes = [node("n1", lent("n1")), node("s1", standby("s1")), node("s2", standby("s2"))]
    got = prewarmed(plan(nodes, at("07:59:00")))
    assert {n: d.role for n, d in got.items()} == {"n1": "Lent", "s1": "Standby", "s2": "Standby"}


def test_no_spare_standby_without_a_backfill_need() -> None:
    nodes = [node("n1", lent("n1")), node("n2", lent("n2")), node("s1", standby("s1"))]
    assert set(prewarmed(plan(nodes, at("07:59:00")))) == {"n1", "n2"}


def test_the_groups_taken_back_are_the_controllers_choice() -> None:
    """A StatefulSet's scale-up by one replica takes back that replica's own group (recsys-2's,
    on n1), borrowers or not; a Deployment's takes the group without borrowers."""
    one_more = lease(
        schedule=False,
        desired=12,
        groups={"recsys-2": "n1", "recsys-3": "n2"},
    )
    borrower = Holder(PodUid("u-b"), "ml", "finetune-0", Priority.LOW, 0)
    holders = {GpuUuid(u): borrower for u in group_of("n1")}
    nodes = [node("n1", lent("n1")), node("n2", lent("n2"))]
    got = prewarmed(plan(nodes, at("07:00:00"), leases=[one_more], holders=holders))
    assert set(got) == {"n1"}
    got = prewarmed(plan(nodes, at("07:00:00"), leases=[one_more]))
    assert set(got) == {"n1"}
    deployment = replace(
        one_more,
        spec=replace(one_more.spec, workload=Workload("apps/v1", "Deployment", "recsys")),
    )
    got = prewarmed(plan(nodes, at("07:00:00"), leases=[deployment], holders=holders))
    assert set(got) == {"n2"}
    got = prewarmed(plan(nodes, at("07:00:00"), leases=[deployment]))
    assert set(got) == {"n1"}  # no borrowers anywhere: the lowest ordinal, as the controller


# --- no scale-up, after the scale-up, lease deleted ---


def test_no_scale_up_ahead_no_directives() -> None:
    nodes = [node("n1", lent("n1")), node("n2", lent("n2"))]
    p = plan(nodes, at("09:00:00"), template=TEMPLATE.__class__(4, (IMAGE,), CKPT))
    assert prewarmed(p) == {}
    assert p.leases[0].why == "no scale-up ahead"  # the next entry, 22:00, scales down


def test_a_scale_down_is_not_prepared_for() -> None:
    nodes = [node("n1", lent("n1")), node("n2", lent("n2"))]
    assert prewarmed(plan(nodes, at("21:55:00"), template=TEMPLATE.__class__(4, (), CKPT))) == {}


def test_directives_stay_through_the_reclaim_and_are_cleared_after_it() -> None:
    nodes = [node("n1", lent("n1")), node("n2", lent("n2"))]
    before = plan(nodes, at("07:57:00"))
    current = {n: ds for n, ds in before.by_node.items() if ds}
    assert set(current) == {"n1", "n2"}
    # 08:00:00.4: the controller started the reclaim; the agents reported Done and the nodes'
    # inventories list the image and checkpoint now: the directives do not change.
    warm = [node("n1", lent("n1"), **WARM), node("n2", lent("n2"), **WARM)]
    reclaiming = lease(
        status={
            "phase": "Reclaiming",
            "targetReplicas": 4,
            "reclaim": {
                "startedAt": "2025-03-10T08:00:00.400000Z",
                "deadline": "2025-03-10T08:00:45.400000Z",
                "groups": ["recsys-2", "recsys-3"],
            },
        }
    )
    during = plan(warm, at("08:00:01"), leases=[reclaiming], current=current)
    assert changes(current, during.by_node) == {}
    # The workload scaled to 4 replicas; the reclaim is not finished yet: still kept.
    scaled = TEMPLATE.__class__(4, (IMAGE,), CKPT)
    still = plan(warm, at("08:00:50"), leases=[reclaiming], current=current, template=scaled)
    assert changes(current, still.by_node) == {}
    # Steady again with 4 replicas: cleared.
    after = plan(warm, at("08:01:10"), current=current, template=scaled)
    assert changes(current, after.by_node) == {"n1": (), "n2": ()}
    assert directives_json(()) is None


def test_an_ongoing_scale_up_without_directives_yet_gets_them_at_once() -> None:
    """A controller started at 08:00:20 (or a W larger than expected): start now."""
    nodes = [node("n1", lent("n1")), node("n2", lent("n2"))]
    got = prewarmed(plan(nodes, at("08:00:20")))
    assert set(got) == {"n1", "n2"}
    assert got["n1"].deadline == T_SCALE  # the schedule entry's start
    assert got["n1"].not_before < at("08:00:20")


def test_a_stale_scale_up_is_given_up() -> None:
    nodes = [node("n1", lent("n1")), node("n2", lent("n2"))]
    assert prewarmed(plan(nodes, at("09:00:01"))) == {}  # 2 replicas still, 1 h later


def test_deleted_lease_clears_its_directives_and_leaves_others() -> None:
    nodes = [node("n1", lent("n1")), node("n2", lent("n2"))]
    current = {n: ds for n, ds in plan(nodes, at("07:57:00")).by_node.items() if ds}  # recsys's
    other = Directive("ml/other", "Lent", (IMAGE,), (), at("07:00:00"), at("08:30:00"), 20.0)
    current["n1"] = (*current["n1"], other)
    gone = plan_prewarm([], {}, nodes, current, SETTINGS, at("07:58:00"))
    assert changes(current, gone.by_node) == {"n1": (), "n2": ()}
    # ml/other's lease still exists but its workload could not be read: kept as is
    other_lease = parse_gpu_lease(
        {
            "metadata": {"namespace": "ml", "name": "other"},
            "spec": builders.gpu_lease_spec("other", gpus_per_replica=4),
        }
    )
    kept = plan_prewarm([other_lease], {"ml/other": None}, nodes, current, SETTINGS, at("07:58:00"))
    assert kept.by_node["n1"] == (other,)
    assert kept.by_node["n2"] == ()


def test_desired_gpus_above_the_replicas_start_now_and_keep_their_time() -> None:
    nodes = [node("n1", lent("n1")), node("n2", lent("n2"))]
    fixed = lease(schedule=False, desired=16)
    first = plan(nodes, at("13:00:00"), leases=[fixed])
    got = prewarmed(first)
    assert set(got) == {"n1", "n2"}
    assert got["n1"].deadline == at("13:00:00")
    current = {n: ds for n, ds in first.by_node.items() if ds}
    later = plan(nodes, at("13:00:07"), leases=[fixed], current=current)
    assert changes(current, later.by_node) == {}
    # desiredGPUs equal to what the replicas hold: nothing to prepare
    steady = lease(schedule=False, desired=8)
    assert prewarmed(plan(nodes, at("13:00:00"), leases=[steady])) == {}


def test_a_new_checkpoint_replaces_the_old_one_in_the_directive() -> None:
    nodes = [node("n1", lent("n1")), node("n2", lent("n2"))]
    first = plan(nodes, at("07:57:00"))
    current = {n: ds for n, ds in first.by_node.items() if ds}
    newer = WorkloadTemplate(2, (IMAGE,), "recsys-ckpt-43", 10 * GB, 100 * GB)
    again = plan(nodes, at("07:57:30"), current=current, template=newer)
    assert {d.checkpoints for ds in again.by_node.values() for d in ds} == {("recsys-ckpt-43",)}


# --- wire format ---


def test_directives_and_items_survive_the_wire() -> None:
    nodes = [node("n1", lent("n1")), node("n2", lent("n2"))]
    ds = prewarmed(plan(nodes, at("07:57:00")))
    for d in ds.values():
        (back,) = parse_directives(directives_json([d]))
        assert back.to_json() == d.to_json()
    assert parse_directives([{"lease": 3}, "x", {"lease": "a/b"}]) == ()
    item = ItemStatus(
        "ml/recsys", "checkpoint", CKPT, "Done", "fetched", 3.5, at("07:58:00"), T_SCALE
    )
    (back_item,) = parse_items({"items": [item.to_json(), {"kind": "nope"}]})
    assert back_item == item
    assert back_item.lead_s == pytest.approx(120.0)
    assert ItemStatus("a/b", "image", IMAGE, "Pending").lead_s is None


def test_workload_template_parsing() -> None:
    sts = {
        "metadata": {"name": "recsys"},
        "spec": {
            "replicas": 3,
            "template": {
                "metadata": {
                    "annotations": {
                        contract.ANN_CHECKPOINT: CKPT,
                        contract.ANN_IMAGE_BYTES: "5e9",
                        contract.ANN_CHECKPOINT_BYTES: "80000000000",
                    }
                },
                "spec": {
                    "initContainers": [{"name": "init", "image": "busybox:1"}],
                    "containers": [
                        {"name": "a", "image": IMAGE},
                        {"name": "b", "image": IMAGE},
                    ],
                },
            },
        },
    }
    t = parse_workload(sts)
    assert t == WorkloadTemplate(3, ("busybox:1", IMAGE), CKPT, 5e9, 8e10)
    sts["spec"]["template"]["metadata"]["annotations"][contract.ANN_IMAGE_BYTES] = "lots"
    with pytest.raises(InvalidInput, match="image-bytes"):
        parse_workload(sts)


def test_settings_validation_names_every_problem() -> None:
    bad = PrewarmSettings(
        bandwidths=Bandwidths(net=0, registry=1, storage=1, gpu=-1),
        margin_s=-1,
        spare_standby_replicas=-1,
        stale_s=0,
    )
    problems = bad.validate()
    assert len(problems) == 5, problems
    assert PrewarmSettings().validate() == []


def test_owner_tagged_standby_devices_of_the_job_count() -> None:
    """Standby devices already on loan to this job (tagged with it) may stand in again."""
    on_loan = builders.devices("s1", 4, standby=True, owner="ml/recsys")
    nodes = [node("n1", lent("n1")), node("s1", on_loan)]
    got = prewarmed(plan(nodes, at("07:59:00")))
    assert set(got) == {"n1", "s1"}


def test_gpu_node_schema_accepts_directives_and_item_reports() -> None:
    import jsonschema
    import yaml

    crd = yaml.safe_load(
        (
            Path(__file__).resolve().parents[2] / "manifests/charts/tidelease/crds/gpunodes.yaml"
        ).read_text()
    )
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    nodes = [node("n1", lent("n1")), node("n2", lent("n2"))]
    obj = builders.gpu_node("n1", lent("n1"))
    obj["spec"]["prewarm"] = directives_json(plan(nodes, at("07:57:00")).by_node["n1"])
    obj["status"]["prewarm"] = {
        "items": [
            ItemStatus("ml/recsys", "image", IMAGE, "Pending", "waiting").to_json(),
            ItemStatus(
                "ml/recsys", "checkpoint", CKPT, "Done", "", 1.5, at("07:58:00"), T_SCALE
            ).to_json(),
        ]
    }
    jsonschema.validate(obj, schema)
    obj["spec"]["prewarm"][0]["role"] = "Other"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(obj, schema)


# --- the controller's step ---


async def test_a_node_deleted_while_its_directives_are_written_does_not_stop_the_controller() -> (
    None
):
    """The watches run beside the step: a GpuNode's DELETED event can land while the step
    writes that node's directives. The step goes on to the other nodes instead of failing (and
    with it the controller)."""
    from prometheus_client import CollectorRegistry

    from extender.prewarm.controller import PrewarmController, PrewarmMetrics, Watched

    watched = Watched()
    stale = Directive("ml/gone", "Lent", (IMAGE,), (), at("07:00:00"), T_SCALE, 20.0)
    for name in ("n1", "n2"):
        obj = builders.gpu_node(name, lent(name))
        obj["spec"]["prewarm"] = directives_json([stale])
        watched.apply("nodes", "ADDED", obj)
    written: list[str] = []

    class DeletedMeanwhile:
        async def template(self, namespace: str, workload: Workload) -> WorkloadTemplate:
            raise AssertionError("no lease, no template")

        async def write(self, node: str, directives: Sequence[Directive]) -> None:
            written.append(node)
            watched.apply("nodes", "DELETED", watched.nodes[node])

    ctl = PrewarmController(
        world=DeletedMeanwhile(),
        metrics=PrewarmMetrics(CollectorRegistry()),
        settings=SETTINGS,
        clock=lambda: at("07:30:00"),
    )
    await ctl.step(watched)
    assert written == ["n1", "n2"]  # the lease is gone: both cleared, the second too
    assert watched.nodes == {}


async def test_a_node_that_cannot_be_written_fails_the_step_after_the_others_are() -> None:
    """One node's write failing (the API server refusing it) holds no other node back; the
    step then fails, naming it, so that the controller's reconcile loop retries it (and counts
    the error) instead of waiting for the next resync."""
    from prometheus_client import CollectorRegistry

    from common.errors import Unavailable
    from extender.prewarm.controller import PrewarmController, PrewarmMetrics, Watched

    watched = Watched()
    changed: list[int] = []
    watched.on_change = lambda: changed.append(1)
    stale = Directive("ml/gone", "Lent", (IMAGE,), (), at("07:00:00"), T_SCALE, 20.0)
    for name in ("n1", "n2", "n3"):
        obj = builders.gpu_node(name, lent(name))
        obj["spec"]["prewarm"] = directives_json([stale])
        watched.apply("nodes", "ADDED", obj)
    assert len(changed) == 3  # every event tells the loop
    written: list[str] = []

    class RefusesN2:
        async def template(self, namespace: str, workload: Workload) -> WorkloadTemplate:
            raise AssertionError("no lease, no template")

        async def write(self, node: str, directives: Sequence[Directive]) -> None:
            if node == "n2":
                raise Unavailable("the API server is down")
            written.append(node)

    registry = CollectorRegistry()
    ctl = PrewarmController(
        world=RefusesN2(),
        metrics=PrewarmMetrics(registry),
        settings=SETTINGS,
        clock=lambda: at("07:30:00"),
    )
    with pytest.raises(Unavailable, match=r"GpuNode\(s\) n2 not written"):
        await ctl.step(watched)
    assert written == ["n1", "n3"]
    assert registry.get_sample_value("tidelease_prewarm_directives_cleared_total") == 2


async def test_a_step_parses_only_what_changed_and_nothing_without_leases() -> None:
    """The step's cost follows the changes: with no GpuLease and nothing to clear it reads no
    GpuNode at all; with a lease, a step after one node's change parses that node alone."""
    from prometheus_client import CollectorRegistry

    from extender.prewarm.controller import PrewarmController, PrewarmMetrics, Watched

    watched = Watched()
    for i in range(200):
        obj = builders.gpu_node(f"n{i}", lent(f"n{i}"))
        obj["metadata"]["resourceVersion"] = "1"
        watched.apply("nodes", "ADDED", obj)
    writes: list[str] = []

    class World:
        async def template(self, namespace: str, workload: Workload) -> WorkloadTemplate:
            return TEMPLATE

        async def write(self, node: str, directives: Sequence[Directive]) -> None:
            writes.append(node)

    ctl = PrewarmController(
        world=World(),
        metrics=PrewarmMetrics(CollectorRegistry()),
        settings=SETTINGS,
        clock=lambda: at("07:30:00"),
    )
    for _ in range(3):
        await ctl.step(watched)
    assert ctl.parsed.parses == 0
    assert writes == []

    raw = {
        "metadata": {"namespace": "ml", "name": "recsys", "resourceVersion": "1"},
        "spec": builders.gpu_lease_spec(
            "recsys",
            gpus_per_replica=4,
            desired_gpus=16,
            schedule=[{"at": "08:00", "gpus": 16}, {"at": "22:00", "gpus": 8}],
        ),
        "status": {"phase": "Steady", "targetReplicas": 2, "lent": []},
    }
    watched.apply("leases", "ADDED", raw)
    await ctl.step(watched)
    assert ctl.parsed.parses == 200  # each node once
    await ctl.step(watched)
    assert ctl.parsed.parses == 200  # nothing changed: nothing parsed again
    changed = dict(watched.nodes["n7"])
    changed["metadata"] = {**changed["metadata"], "resourceVersion": "2"}
    watched.apply("nodes", "MODIFIED", changed)
    await ctl.step(watched)
    assert ctl.parsed.parses == 201  # that node alone
    watched.apply("nodes", "DELETED", changed)
    await ctl.step(watched)
    assert "n7" not in ctl.parsed.nodes
