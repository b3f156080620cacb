"""Scores: cache locality, right of return, reliability fit and packing, 0-10."""

from __future__ import annotations

from common import builders
from common.model import Priority, Tier
from common.podrequest import parse_pod
from extender.scheduler.scoring import ScoreWeights, prioritize_nodes
from tests.unit.cluster import allocate, cluster, holder

W = ScoreWeights()


def scores(state, pod, names):  # type: ignore[no-untyped-def]
    return dict(prioritize_nodes(state, parse_pod(pod), names, W))


def test_cache_holding_node_is_preferred() -> None:
    state = cluster(
        builders.gpu_node("plain"),
        builders.gpu_node("ckpt", checkpoints=["ck-1"]),
        builders.gpu_node("both", checkpoints=["ck-1"], images=["img:v1"]),
        builders.gpu_node("image", images=["img:v1"]),
    )
    s = scores(
        state,
        builders.pod("p", 2, checkpoint="ck-1", image="img:v1"),
        ["plain", "ckpt", "both", "image"],
    )
    assert s["both"] > s["ckpt"] > s["image"] > s["plain"]


def test_owner_prefers_its_own_tagged_devices() -> None:
    state = cluster(
        builders.gpu_node("untagged"),
        builders.gpu_node("mine", builders.devices("mine", 8, owner="a")),
    )
    pod = builders.pod("p", 8, priority=Priority.HIGH, owner="a")
    s = scores(state, pod, ["untagged", "mine"])
    assert s["mine"] > s["untagged"]


def test_borrower_prefers_untagged_devices() -> None:
    state = cluster(
        builders.gpu_node("untagged"),
        builders.gpu_node("lent", builders.devices("lent", 8, owner="a")),
    )
    s = scores(state, builders.pod("p", 8), ["untagged", "lent"])
    assert s["untagged"] > s["lent"]


def test_best_fit_tier_and_packing() -> None:
    state = cluster(
        builders.gpu_node("ha"),
        builders.gpu_node("la", builders.devices("la", 8, tier=Tier.LA)),
        builders.gpu_node("busy"),
    )
    allocate(state, "busy", [(holder("x"), [builders.device_uuid("busy", i) for i in range(6)])])
    s = scores(state, builders.pod("p", 2), ["ha", "la", "busy"])
    assert s["la"] > s["ha"]  # an LA-tolerant pod leaves HA devices free
    assert s["busy"] > s["ha"]  # and fills a busy node first


def test_scores_are_within_0_and_10_and_unfit_nodes_score_0() -> None:
    state = cluster(
        builders.gpu_node("a"), builders.gpu_node("small", builders.devices("small", 1))
    )
    s = scores(state, builders.pod("p", 4, checkpoint="c"), ["a", "small", "unknown"])
    assert s["small"] == 0
    assert s["unknown"] == 0
    assert all(0 <= v <= 10 for v in s.values())
    full = cluster(builders.gpu_node("f", checkpoints=["c"], images=["i"]))
    top = scores(full, builders.pod("p", 8, checkpoint="c", image="i", tier=Tier.HA), ["f"])
    assert top["f"] == 10
