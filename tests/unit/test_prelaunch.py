"""The prelaunch window W (weflex equations 1-3). The paper gives the equations but no worked
numbers; the cases below are computed by hand from them."""

from __future__ import annotations

import pytest

from common.prelaunch import Bandwidths, PrelaunchInputs, for_node, hit_ratio, prelaunch_window

GB = 1e9
# 10 Gbit/s network, a 0.5 GB/s registry, 2 GB/s checkpoint storage, 50 GB/s GPU interconnect.
LINKS = Bandwidths(net=1.25 * GB, registry=0.5 * GB, storage=2 * GB, gpu=50 * GB)


def inputs(image_hit: float, checkpoint_hit: float, gpu_adjust_s: float = 5.0) -> PrelaunchInputs:
    return PrelaunchInputs(
        image_bytes=10 * GB,
        checkpoint_bytes=100 * GB,
        image_hit=image_hit,
        checkpoint_hit=checkpoint_hit,
        bandwidths=LINKS,
        gpu_adjust_s=gpu_adjust_s,
    )


@pytest.mark.parametrize(
    ("image_hit", "checkpoint_hit", "image_s", "checkpoint_s", "window_s", "bottleneck"),
    [
        # cold standby node: 10 GB / min(1.25, 0.5) = 20 s; 100 GB / min(1.25, 2) + 100/50 = 82 s
        pytest.param(0.0, 0.0, 20.0, 82.0, 87.0, "checkpoint", id="cold"),
        # the original node comes back: both cached, only the GPU load remains
        pytest.param(1.0, 1.0, 0.0, 2.0, 7.0, "checkpoint", id="reclaimed-original"),
        # image cached, checkpoint half there: 50 GB / 1.25 + 2 = 42 s
        pytest.param(1.0, 0.5, 0.0, 42.0, 47.0, "checkpoint", id="half-checkpoint"),
        # checkpoint cached, image not: the image is the bottleneck at 20 s
        pytest.param(0.0, 1.0, 20.0, 2.0, 25.0, "image", id="image-missing"),
    ],
)
def test_window_follows_equations_1_to_3(
    image_hit: float,
    checkpoint_hit: float,
    image_s: float,
    checkpoint_s: float,
    window_s: float,
    bottleneck: str,
) -> None:
    w = prelaunch_window(inputs(image_hit, checkpoint_hit))
    assert w.image_s == pytest.approx(image_s)
    assert w.checkpoint_s == pytest.approx(checkpoint_s)
    assert w.window_s == pytest.approx(window_s)
    assert w.bottleneck == bottleneck


def test_slowest_link_bounds_each_transfer() -> None:
    fast_registry = Bandwidths(net=1.25 * GB, registry=100 * GB, storage=100 * GB, gpu=50 * GB)
    w = for_node(
        image_present=False,
        checkpoint_present=False,
        image_bytes=10 * GB,
        checkpoint_bytes=100 * GB,
        bandwidths=fast_registry,
    )
    assert w.image_s == pytest.approx(8.0)  # the network, not the registry, limits
    assert w.checkpoint_s == pytest.approx(80.0 + 2.0)
    assert w.window_s == pytest.approx(82.0)


@pytest.mark.parametrize(
    ("present", "total", "ratio"),
    [(0, 10, 0.0), (5, 10, 0.5), (10, 10, 1.0), (12, 10, 1.0), (0, 0, 1.0)],
)
def test_hit_ratio(present: float, total: float, ratio: float) -> None:
    assert hit_ratio(present, total) == ratio


def test_validate_returns_every_problem() -> None:
    bad = PrelaunchInputs(
        image_bytes=-1,
        checkpoint_bytes=1,
        image_hit=1.5,
        checkpoint_hit=0,
        bandwidths=Bandwidths(net=0, registry=1, storage=1, gpu=-1),
    )
    assert len(bad.validate()) == 4
    assert inputs(0, 0).validate() == []
