"""The hot-restart annotation contract, the node agent's decision for kubelet-managed pods, its
executor on fakes (a pod the test plays kubelet for), and the operator's decision."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from common import contract
from common.errors import Conflict, InvalidInput, Unavailable
from common.hotrestartwire import (
    Phase,
    PodView,
    Request,
    Status,
    normalized,
    parse_request,
    parse_status,
    parse_wish,
    pod_view,
)
from extender.hotrestart import operator as operator_module
from extender.hotrestart.operator import HotRestartOperator, KubeRequests, run_hot_restart_operator
from extender.hotrestart.policy import Reject, WriteRequest
from extender.hotrestart.policy import decide as operator_decide
from nodeagent.cri.testing import FakeRuntime
from nodeagent.hotrestart.podwatch import PodRestarter, PodRestartSettings, run_pod_hot_restarts
from nodeagent.hotrestart.restartdecision import Begin, Finish, Wait, decide
from tests.polling import eventually

V1, V2 = "local/app:v1", "local/app:v2"
REQ = Request("r1", "app", V2)
NEXT = Request("r2", "app", "local/app:v3")


def pod(
    *,
    image: str = V1,
    cid: str = "containerd://old",
    running_image: str = "docker.io/local/app:v1",
    running: bool = True,
    waiting: str = "",
    ann: dict[str, str] | None = None,
    phase: str = "Running",
) -> dict[str, Any]:
    state: dict[str, Any] = {"running": {}} if running else {"waiting": {"reason": waiting}}
    return {
        "metadata": {
            "namespace": "ns",
            "name": "trainer-0",
            "uid": "uid-1",
            "resourceVersion": "7",
            "annotations": {contract.ANN_HOT_RESTART: "true", **(ann or {})},
        },
        "spec": {"nodeName": "n1", "containers": [{"name": "app", "image": image}]},
        "status": {
            "phase": phase,
            "containerStatuses": [
                {"name": "app", "containerID": cid, "image": running_image, "state": state}
            ],
        },
    }


def requested(status: Status | None = None, **kw: Any) -> dict[str, Any]:
    ann = {contract.ANN_HOT_RESTART_REQUEST: REQ.to_annotation()}
    if status is not None:
        ann[contract.ANN_HOT_RESTART_STATUS] = status.to_annotation()
    return pod(ann=ann, **kw)


def restarting(started_at: float = 100.0) -> Status:
    return Status(
        "r1",
        Phase.RESTARTING,
        "app",
        V2,
        old_image=V1,
        old_container_id="containerd://old",
        started_at=started_at,
    )


# --- the contract ---


def test_request_and_status_round_trip() -> None:
    assert parse_request(REQ.to_annotation()) == REQ
    done = Status("r1", Phase.SUCCEEDED, "app", V2, "ok", V1, "a", "b", 1.0, 3.5)
    assert parse_status(done.to_annotation()) == done
    assert '"durationSeconds":2.5' in done.to_annotation()


@pytest.mark.parametrize(
    "value", ["", "{}", "[]", '{"id":"x","container":"app"}', "not json"], ids=str
)
def test_bad_requests_are_invalid(value: str) -> None:
    with pytest.raises(InvalidInput):
        parse_request(value)


@pytest.mark.parametrize(
    ("value", "want"),
    [
        ("app=local/app:v2", ("app", "local/app:v2")),
        (" app = reg.example:5000/x/app@sha256:ab ", ("app", "reg.example:5000/x/app@sha256:ab")),
    ],
)
def test_parse_wish(value: str, want: tuple[str, str]) -> None:
    assert parse_wish(value) == want


@pytest.mark.parametrize("value", ["app", "=img", "app=", "app=a b"])
def test_bad_wishes(value: str) -> None:
    with pytest.raises(InvalidInput):
        parse_wish(value)


@pytest.mark.parametrize(
    ("image", "want"),
    [
        ("busybox", "docker.io/library/busybox:latest"),
        ("local/app:v2", "docker.io/local/app:v2"),
        ("docker.io/local/app:v2", "docker.io/local/app:v2"),
        ("localhost:5000/app", "localhost:5000/app:latest"),
        ("reg.example/app@sha256:ab", "reg.example/app@sha256:ab"),
        ("app@sha256:ab", "docker.io/library/app@sha256:ab"),
        ("team/app:v2@sha256:ab", "docker.io/team/app:v2@sha256:ab"),
        ("localhost:5000/app@sha256:ab", "localhost:5000/app@sha256:ab"),
    ],
)
def test_normalized(image: str, want: str) -> None:
    assert normalized(image) == want


def test_a_pinned_image_is_no_change_of_image() -> None:
    """The same digest, short and long: the operator must not restart the pod for it."""
    view = wish("app=busybox@sha256:ab", image="docker.io/library/busybox@sha256:ab")
    assert operator_decide(view, now=1.0) is None


def test_unreadable_annotations_are_problems_not_crashes() -> None:
    raw = pod(ann={contract.ANN_HOT_RESTART_REQUEST: "{", contract.ANN_HOT_RESTART_STATUS: "1"})
    view = pod_view(raw)
    assert view.request is None
    assert view.status is None
    assert len(view.problems) == 2


def test_deeply_nested_annotations_are_problems_not_crashes() -> None:
    deep = "[" * 100_000 + "]" * 100_000
    raw = pod(ann={contract.ANN_HOT_RESTART_REQUEST: deep, contract.ANN_HOT_RESTART_STATUS: deep})
    view = pod_view(raw)
    assert (view.request, view.status) == (None, None)
    assert view.problems == (
        f"{contract.ANN_HOT_RESTART_REQUEST}: not JSON: nested too deeply",
        f"{contract.ANN_HOT_RESTART_STATUS}: not JSON: nested too deeply",
    )


@pytest.mark.parametrize(
    "number",
    ["1" + "0" * 400, "NaN", "Infinity", "-Infinity", "1e999"],
    ids=["long-integer", "nan", "infinity", "minus-infinity", "float-overflow"],
)
def test_status_times_that_are_no_finite_number_read_as_missing(number: str) -> None:
    value = f'{{"id":"r1","phase":"Succeeded","startedAt":{number},"finishedAt":{number}}}'
    status = parse_status(value)
    assert (status.started_at, status.finished_at) == (0.0, 0.0)
    assert '"startedAt":0.0' in status.to_annotation()


# --- the node agent's decision ---


@pytest.mark.parametrize(
    ("raw", "now", "want"),
    [
        pytest.param(pod(), 0.0, None, id="no-request"),
        pytest.param(requested(), 0.0, Begin(REQ, V1, "containerd://old"), id="new-request"),
        pytest.param(
            requested(Status("r0", Phase.SUCCEEDED, "app", V1)),
            0.0,
            Begin(REQ, V1, "containerd://old"),
            id="older-status",
        ),
        pytest.param(
            requested(Status("r1", Phase.FAILED, "app", V2)), 0.0, None, id="failed-stays"
        ),
        pytest.param(requested(restarting(), image=V2), 110.0, Wait(220.0), id="waiting"),
    ],
)
def test_agent_decision(raw: dict[str, Any], now: float, want: object) -> None:
    assert decide(pod_view(raw), now, timeout_s=120.0) == want


def test_agent_success_when_a_new_container_of_the_new_image_runs() -> None:
    raw = requested(
        restarting(), image=V2, cid="containerd://new", running_image="docker.io/local/app:v2"
    )
    got = decide(pod_view(raw), 103.0, timeout_s=120.0)
    assert isinstance(got, Finish)
    assert got.status.phase is Phase.SUCCEEDED
    assert got.status.new_container_id == "containerd://new"
    assert got.rollback_to == ""
    assert got.status.finished_at - got.status.started_at == 3.0


@pytest.mark.parametrize(
    ("raw", "now", "phrase"),
    [
        pytest.param(
            requested(restarting(), image=V2, running=False, waiting="CrashLoopBackOff"),
            101.0,
            "CrashLoopBackOff",
            id="crashloop",
        ),
        pytest.param(
            requested(restarting(), image=V2, running=False, waiting="ContainerCreating"),
            300.0,
            "within 120 s",
            id="timeout",
        ),
    ],
)
def test_agent_rolls_back_a_restart_that_does_not_come_up(
    raw: dict[str, Any], now: float, phrase: str
) -> None:
    got = decide(pod_view(raw), now, timeout_s=120.0)
    assert isinstance(got, Finish)
    assert got.status.phase is Phase.FAILED
    assert phrase in got.status.reason
    assert got.rollback_to == V1


def test_agent_rejects_a_request_for_an_unknown_container() -> None:
    raw = pod(ann={contract.ANN_HOT_RESTART_REQUEST: Request("r1", "nope", V2).to_annotation()})
    got = decide(pod_view(raw), 5.0, timeout_s=120.0)
    assert isinstance(got, Finish)
    assert got.status.phase is Phase.FAILED
    assert "no container 'nope'" in got.status.reason


# --- the agent's executor, with the test as kubelet ---


@dataclass
class FakePods:
    """Applies the agent's writes to one pod object, as the API server would."""

    raw: dict[str, Any]
    events: list[tuple[str, str]] = field(default_factory=list)

    async def write(self, pod: PodView, status: Status, image: tuple[str, str] | None) -> None:
        ann = self.raw["metadata"]["annotations"]
        ann[contract.ANN_HOT_RESTART_STATUS] = status.to_annotation()
        if image is not None:
            for c in self.raw["spec"]["containers"]:
                if c["name"] == image[0]:
                    c["image"] = image[1]

    async def event(self, pod: PodView, reason: str, message: str, warning: bool) -> None:
        self.events.append((reason, message))

    def view(self) -> PodView:
        return pod_view(copy.deepcopy(self.raw))

    def kubelet_restarts(self, cid: str, image: str, running: bool = True) -> None:
        (cs,) = self.raw["status"]["containerStatuses"]
        cs.update(containerID=cid, image=image)
        cs["state"] = {"running": {}} if running else {"waiting": {"reason": "ErrImagePull"}}


@dataclass
class Clock:
    now: float = 100.0

    def __call__(self) -> float:
        return self.now


def agent(rt: FakeRuntime, pods: FakePods, clock: Clock) -> PodRestarter:
    return PodRestarter(runtime=rt, pods=pods, settings=PodRestartSettings(node="n1"), clock=clock)


async def test_agent_pulls_patches_and_reports_success() -> None:
    rt = FakeRuntime(images=set(), pullable={V2})
    pods, clock = FakePods(requested()), Clock()
    restarter = agent(rt, pods, clock)
    assert await restarter.handle(pods.view()) == 101.0
    assert rt.calls == ["ImageStatus", "PullImage"]
    view = pods.view()
    assert view.images["app"] == V2
    assert view.status is not None
    assert view.status.phase is Phase.RESTARTING
    assert view.status.old_container_id == "containerd://old"
    clock.now = 102.0
    assert await restarter.handle(view) == 103.0  # the kubelet has not restarted it yet
    pods.kubelet_restarts("containerd://new", "docker.io/local/app:v2")
    clock.now = 104.5
    assert await restarter.handle(pods.view()) is None
    done = pods.view().status
    assert done is not None
    assert (done.phase, done.new_container_id) == (Phase.SUCCEEDED, "containerd://new")
    assert pods.events == [
        ("HotRestarted", "container app: restarted in place on the new image (4.5 s)")
    ]
    assert await restarter.handle(pods.view()) is None  # done: nothing more


async def test_agent_failed_pull_leaves_the_pod_untouched() -> None:
    rt = FakeRuntime(images=set(), unpullable={V2})
    pods = FakePods(requested())
    await agent(rt, pods, Clock()).handle(pods.view())
    view = pods.view()
    assert view.images["app"] == V1
    assert view.status is not None
    assert view.status.phase is Phase.FAILED
    assert "left untouched" in view.status.reason
    assert pods.events[0][0] == "HotRestartFailed"


async def test_agent_sets_the_old_image_back_when_the_new_one_fails() -> None:
    rt = FakeRuntime(images={V2})
    pods, clock = FakePods(requested()), Clock()
    restarter = agent(rt, pods, clock)
    await restarter.handle(pods.view())
    pods.kubelet_restarts("containerd://new", "docker.io/local/app:v2", running=False)
    await restarter.handle(pods.view())
    view = pods.view()
    assert view.images["app"] == V1
    assert view.status is not None
    assert view.status.phase is Phase.FAILED


# --- the operator's decision ---


def wish(value: str, **kw: Any) -> PodView:
    raw = pod(**kw)
    raw["metadata"]["annotations"][contract.ANN_HOT_RESTART_IMAGE] = value
    return pod_view(raw)


def test_operator_requests_a_changed_image() -> None:
    got = operator_decide(wish(f"app={V2}"), now=1.0)
    assert isinstance(got, WriteRequest)
    assert (got.request.container, got.request.image) == ("app", V2)
    again = operator_decide(wish(f"app={V2}"), now=1.0)
    assert isinstance(again, WriteRequest)
    assert again.request.id == got.request.id  # same wish, same version: same id


@pytest.mark.parametrize(
    "view",
    [
        pytest.param(pod_view(pod()), id="no-wish"),
        pytest.param(wish(f"app={V1}"), id="already-running-it"),
        pytest.param(wish(f"app={V2}", phase="Pending"), id="not-running-yet"),
        pytest.param(
            wish(f"app={V2}", ann={contract.ANN_HOT_RESTART_REQUEST: REQ.to_annotation()}),
            id="already-requested",
        ),
        pytest.param(
            wish(
                "app=local/app:v3",
                ann={contract.ANN_HOT_RESTART_REQUEST: REQ.to_annotation()},
            ),
            id="one-at-a-time",
        ),
    ],
)
def test_operator_leaves_alone(view: PodView) -> None:
    assert operator_decide(view, now=1.0) is None


def test_operator_not_opted_in() -> None:
    raw = pod()
    raw["metadata"]["annotations"] = {contract.ANN_HOT_RESTART_IMAGE: f"app={V2}"}
    assert operator_decide(pod_view(raw), now=1.0) is None


def test_operator_next_wish_after_the_last_request_ended() -> None:
    done = Status("r1", Phase.SUCCEEDED, "app", V2)
    view = wish(
        "app=local/app:v3",
        image=V2,
        ann={
            contract.ANN_HOT_RESTART_REQUEST: REQ.to_annotation(),
            contract.ANN_HOT_RESTART_STATUS: done.to_annotation(),
        },
    )
    got = operator_decide(view, now=1.0)
    assert isinstance(got, WriteRequest)
    assert got.request.image == "local/app:v3"


@pytest.mark.parametrize("value", ["nope=local/app:v2", "garbage"])
def test_operator_rejects_impossible_wishes_once(value: str) -> None:
    got = operator_decide(wish(value), now=1.0)
    assert isinstance(got, Reject)
    assert got.status.phase is Phase.FAILED
    assert "nothing was changed" in got.status.reason
    raw = pod(ann={contract.ANN_HOT_RESTART_STATUS: got.status.to_annotation()})
    raw["metadata"]["annotations"][contract.ANN_HOT_RESTART_IMAGE] = value
    assert operator_decide(pod_view(raw), now=2.0) is None


@pytest.mark.parametrize(
    "status",
    [
        pytest.param(None, id="request-not-taken-up-yet"),
        pytest.param(restarting(), id="restart-under-way"),
    ],
)
def test_operator_rejects_an_impossible_wish_only_once_the_request_in_progress_ended(
    status: Status | None,
) -> None:
    """The rejection replaces the status annotation: written during a restart, it would hide
    that restart's progress from the agent (which would then begin it all over again)."""
    ann = {contract.ANN_HOT_RESTART_REQUEST: REQ.to_annotation()}
    if status is not None:
        ann[contract.ANN_HOT_RESTART_STATUS] = status.to_annotation()
    assert operator_decide(wish("garbage", ann=ann), now=1.0) is None


class PatchingKube:
    """The API server's side of the operator's writes on one pod's annotations: merge patches
    (null removes a key) with the uid and resourceVersion preconditions; Events are counted."""

    def __init__(self, raw: dict[str, Any]) -> None:
        self.raw, self.events = raw, 0

    async def json(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        if method == "POST" and path.endswith("/events"):
            self.events += 1
            return {}
        assert method == "PATCH"
        assert kwargs["content_type"] in (
            "application/merge-patch+json",
            "application/strategic-merge-patch+json",  # the same on annotations
        )
        patch, meta = kwargs["body"]["metadata"], self.raw["metadata"]
        assert patch["uid"] == meta["uid"]
        if patch.get("resourceVersion", meta["resourceVersion"]) != meta["resourceVersion"]:
            raise Conflict("the object has been modified")
        for key, value in patch["annotations"].items():
            if value is None:
                meta["annotations"].pop(key, None)
            else:
                meta["annotations"][key] = value
        meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)
        return self.raw


async def test_a_rejection_does_not_make_the_agent_run_the_last_request_again() -> None:
    """The agent tells a new request by a status of another id; the rejection's status has
    another id, so the finished request must go with it (before, the agent pulled and patched
    the old request's image once more)."""
    done = Status("r1", Phase.FAILED, "app", V2, "rolled back", V1, "containerd://old")
    raw = pod(
        ann={
            contract.ANN_HOT_RESTART_REQUEST: REQ.to_annotation(),
            contract.ANN_HOT_RESTART_STATUS: done.to_annotation(),
            contract.ANN_HOT_RESTART_IMAGE: "garbage",
        }
    )
    reject = operator_decide(pod_view(raw), now=1.0)
    assert isinstance(reject, Reject)
    kube = PatchingKube(raw)
    await KubeRequests(kube).reject(pod_view(raw), reject)  # type: ignore[arg-type]
    view = pod_view(raw)
    assert view.status == reject.status
    assert view.request is None
    assert kube.events == 1
    assert decide(view, 2.0, timeout_s=120.0) is None  # the agent: nothing to do
    assert operator_decide(view, now=2.0) is None  # the operator: rejected once


async def test_a_rejection_written_on_a_stale_view_is_a_conflict() -> None:
    raw = pod(ann={contract.ANN_HOT_RESTART_IMAGE: "garbage"})
    stale = pod_view(copy.deepcopy(raw))
    raw["metadata"]["resourceVersion"] = "8"  # the agent wrote meanwhile
    reject = operator_decide(stale, now=1.0)
    assert isinstance(reject, Reject)
    with pytest.raises(Conflict):
        await KubeRequests(PatchingKube(raw)).reject(stale, reject)  # type: ignore[arg-type]
    assert contract.ANN_HOT_RESTART_STATUS not in raw["metadata"]["annotations"]


# --- the watch loops, on a scripted watch ---


class ScriptedWatch:
    """list_watch that yields the given events, then waits forever (until cancelled)."""

    def __init__(self, events: list[tuple[str, dict[str, Any]]]) -> None:
        self.events = events
        self.queries: list[dict[str, Any] | None] = []

    async def list_watch(
        self, path: str, query: dict[str, Any] | None = None
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        self.queries.append(query)
        for event in self.events:
            yield event
        await asyncio.Event().wait()


async def test_agent_loop_steps_requested_pods_of_its_node() -> None:
    pods = FakePods(requested())
    rt = FakeRuntime(images={V2})
    watch = ScriptedWatch([("ADDED", copy.deepcopy(pods.raw)), ("SYNCED", {})])
    restarter = agent(rt, pods, Clock())
    task = asyncio.create_task(
        run_pod_hot_restarts(kube=watch, restarter=restarter)  # type: ignore[arg-type]
    )
    try:
        await eventually(lambda: _phase(pods), within_s=5)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert watch.queries == [{"fieldSelector": "spec.nodeName=n1"}]
    assert pods.view().images["app"] == V2


async def _phase(pods: FakePods) -> Phase | None:
    status = pods.view().status
    return status.phase if status is not None and status.phase is Phase.RESTARTING else None


class QueueWatch:
    """list_watch that yields what the test puts into ``events``, until cancelled."""

    def __init__(self) -> None:
        self.events: asyncio.Queue[tuple[str, dict[str, Any]]] = asyncio.Queue()

    async def list_watch(
        self, path: str, query: dict[str, Any] | None = None
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        while True:
            yield await self.events.get()


@dataclass
class NextRequestDuringTheEvent(FakePods):
    """While the agent posts the Event of a finished restart, the operator writes the next
    request (it saw the terminal status) and the watch delivers it."""

    watch: QueueWatch = field(default_factory=QueueWatch)

    async def event(self, pod: PodView, reason: str, message: str, warning: bool) -> None:
        await super().event(pod, reason, message, warning)
        if len(self.events) == 1:
            ann = self.raw["metadata"]["annotations"]
            ann[contract.ANN_HOT_RESTART_REQUEST] = NEXT.to_annotation()
            self.watch.events.put_nowait(("MODIFIED", copy.deepcopy(self.raw)))
            for _ in range(5):
                await asyncio.sleep(0)  # the watch task takes the event in


async def test_agent_loop_takes_up_a_request_that_arrived_while_it_finished_the_last() -> None:
    pods = NextRequestDuringTheEvent(
        requested(restarting(), image=V2, cid="containerd://new", running_image=V2)
    )
    rt = FakeRuntime(images={V2, NEXT.image})
    pods.watch.events.put_nowait(("ADDED", copy.deepcopy(pods.raw)))
    pods.watch.events.put_nowait(("SYNCED", {}))
    task = asyncio.create_task(
        run_pod_hot_restarts(kube=pods.watch, restarter=agent(rt, pods, Clock()))  # type: ignore[arg-type]
    )

    async def second_request_taken_up() -> bool:
        status = pods.view().status
        return status is not None and status.id == NEXT.id

    try:
        await eventually(second_request_taken_up, within_s=3)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert pods.events[0][0] == "HotRestarted"
    assert pods.view().images["app"] == NEXT.image


@dataclass
class FakeRequests:
    written: list[Request] = field(default_factory=list)

    async def request(self, pod: PodView, request: Request) -> None:
        self.written.append(request)

    async def wish(self, pod: PodView, wish: str, workload: str) -> None:
        raise AssertionError(wish)

    async def reject(self, pod: PodView, reject: Reject) -> None:
        raise AssertionError(reject)


async def test_operator_loop_requests_opted_in_wishes() -> None:
    raw = pod()
    raw["metadata"]["annotations"][contract.ANN_HOT_RESTART_IMAGE] = f"app={V2}"
    plain = pod()
    plain["metadata"]["annotations"] = {}
    watch = ScriptedWatch([("ADDED", plain), ("ADDED", raw), ("SYNCED", {})])
    requests = FakeRequests()
    operator = HotRestartOperator(requests=requests, clock=lambda: 1.0)
    task = asyncio.create_task(
        run_hot_restart_operator(kube=watch, operator=operator)  # type: ignore[arg-type]
    )

    async def written() -> list[Request]:
        return requests.written

    try:
        (req,) = await eventually(written, within_s=5)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert (req.container, req.image) == ("app", V2)


@dataclass
class FlakyRequests(FakeRequests):
    """Each pod's first request raises what ``first`` says for it; ``tried`` lists every
    attempt by pod name."""

    first: dict[str, Exception] = field(default_factory=dict)
    tried: list[str] = field(default_factory=list)

    async def request(self, pod: PodView, request: Request) -> None:
        self.tried.append(pod.name)
        failure = self.first.pop(pod.name, None)
        if failure is not None:
            raise failure
        await super().request(pod, request)


async def test_operator_loop_retries_a_failed_write_and_leaves_a_conflict_to_the_watch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(operator_module, "RETRY_BASE_S", 0.01)
    pods = []
    for name in ("flaky", "raced"):
        raw = pod()
        raw["metadata"].update(name=name, uid=f"uid-{name}")
        raw["metadata"]["annotations"][contract.ANN_HOT_RESTART_IMAGE] = f"app={V2}"
        pods.append(("ADDED", raw))
    watch = ScriptedWatch([*pods, ("SYNCED", {})])
    requests = FlakyRequests(
        first={"flaky": Unavailable("API server unreachable"), "raced": Conflict("modified")}
    )
    operator = HotRestartOperator(requests=requests, clock=lambda: 1.0)
    task = asyncio.create_task(
        run_hot_restart_operator(kube=watch, operator=operator)  # type: ignore[arg-type]
    )

    async def written() -> list[Request]:
        return requests.written

    try:
        await eventually(written, within_s=5)
        await asyncio.sleep(0.2)  # twenty retry periods: a retried conflict would show
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    # The outage is retried; the conflict waits for the watch to bring the new version.
    assert sorted(requests.tried) == ["flaky", "flaky", "raced"]
    assert len(requests.written) == 1
