"""The embedded default job: the demo replays a day of tides and the guarantees hold."""

from __future__ import annotations

import io

from extender.demo import run_demo


async def test_demo_right_of_return_story() -> None:
    out = io.StringIO()
    report = await run_demo(out=out)
    text = out.getvalue()
    # recsys lent 8 devices; the healthy ones on the reclaimable pod came back, the pod whose
    # lent devices include the failed one was backfilled from standby (same type and tier).
    assert sum(len(v) for v in report.lent.values()) == 8
    assert report.returned == 4
    assert report.backfilled == 4
    # ads (high priority) never landed on recsys' tags
    _, ads_devices = report.placements["ads-0"]
    assert ads_devices
    assert not set(ads_devices) & {u for v in report.lent.values() for u in v}
    assert "tagged for another job's right of return" in text
    # borrowers took lent devices, and one was preempted to give them back
    lent = {u for v in report.lent.values() for u in v}
    borrowed = [
        n
        for n, (_, devs) in report.placements.items()
        if n.startswith("finetune") and set(devs) & lent
    ]
    assert borrowed
    assert "evict finetune" in text
