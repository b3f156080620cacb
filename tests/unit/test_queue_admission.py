"""Cornucopia's MLFQ as live admission (extender.queues.admission): the release order, the
counters and moves, completions adapting the thresholds, the book as stored, the pods read."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from common import builders, contract
from common.jobclasses import JobClass, JobKind
from common.timefmt import rfc3339
from extender.queues.admission import (
    FORGET_AFTER_S,
    Book,
    Entry,
    JobObs,
    PodObs,
    advance,
    book_from_json,
    book_to_json,
    observe,
    release,
)
from extender.queues.fitting import Capacity, Constraints, NodeFacts
from extender.queues.mlfq import Means, Queue, Thresholds

T = Thresholds(demote_1_s=100.0, demote_2_s=200.0, promote_3_s=50.0)
INTERACTIVE, BATCH = JobClass(JobKind.INTERACTIVE), JobClass(JobKind.BATCH)


def pod(name: str, gpus: int = 1, *, created: float = 0.0, gated: bool = True, **kw: Any) -> PodObs:
    return PodObs("ns", name, f"uid-{name}", gpus, created, gated, kw.pop("bound", False),
                  kw.pop("phase", "Pending"), **kw)  # fmt: skip


def running(name: str, gpus: int = 1, started: float = 0.0) -> PodObs:
    return pod(name, gpus, gated=False, bound=True, phase="Running", started=started)


def job(key: str, cls: JobClass, *pods: PodObs) -> JobObs:
    return JobObs(key, cls, pods)


def room(free: int) -> Capacity:
    """One node, ``free`` GPUs free on it."""
    return Capacity({"n1": NodeFacts("n1")}, {"n1": free})


def names(releases: list[Any]) -> list[str]:
    return [r.name for r in releases]


def test_interactive_pods_go_first_and_always_batch_ones_only_while_they_fit() -> None:
    jobs = {
        "b1": job("b1", BATCH, pod("b1-0", 2, created=1), pod("b1-1", 2, created=2)),
        "b2": job("b2", BATCH, pod("b2-0", 1, created=0)),
        "chat": job("chat", INTERACTIVE, pod("chat-0", 4, created=9)),
    }
    book = Book({}, T)
    # Nothing free: the interactive pod is released all the same (it preempts), no batch one.
    assert names(release(jobs, book, room(0))) == ["chat-0"]
    # First come, first served within queue 2 (b2's pod was created first).
    assert names(release(jobs, book, room(7))) == ["chat-0", "b2-0", "b1-0"]
    # GPUs of pods released but not yet placed are not free.
    taken = room(7)
    taken.take("n1", 1)
    assert names(release(jobs, book, taken)) == ["chat-0", "b2-0"]


def test_the_first_pod_that_does_not_fit_stops_every_later_one() -> None:
    book = Book(
        {
            "big": Entry(JobKind.BATCH, Queue.BATCH, since=0),
            "small": Entry(JobKind.BATCH, Queue.BATCH, since=5),
            "long": Entry(JobKind.BATCH, Queue.LONG, since=1),
        },
        T,
    )
    jobs = {
        "big": job("big", BATCH, pod("big-0", 8)),
        "small": job("small", BATCH, pod("small-0", 1)),
        "long": job("long", BATCH, pod("long-0", 1)),
    }
    # 2 free: big (head of queue 2) does not fit; small and the queue-3 job wait behind it.
    assert release(jobs, book, room(2)) == []
    assert names(release(jobs, book, room(9))) == ["big-0", "small-0"]  # long: no GPU left


def test_a_pod_that_does_not_fit_keeps_only_the_nodes_it_may_use() -> None:
    """Head of line per node: big waits for n1 and keeps it; small, held to nothing, goes to
    n2; pinned, held to n1 only, waits behind big."""
    nodes = {"n1": NodeFacts("n1", {"pool": "a"}), "n2": NodeFacts("n2", {"pool": "b"})}
    on_a = Constraints(selector=(("pool", "a"),))
    jobs = {
        "big": job("big", BATCH, replace(pod("big-0", 8, created=0), constraints=on_a)),
        "pinned": job("pinned", BATCH, replace(pod("pinned-0", 1, created=1), constraints=on_a)),
        "small": job("small", BATCH, pod("small-0", 1, created=2)),
    }
    got = release(jobs, Book({}, T), Capacity(nodes, {"n1": 4, "n2": 1}))
    assert names(got) == ["small-0"]


def test_executed_time_demotes_and_starved_time_promotes_with_fresh_counters() -> None:
    jobs = {"b": job("b", BATCH, running("b-0"))}
    book, moves = advance(Book({}, T), jobs, 1000.0, adapt_every=10)
    assert book.jobs["b"] == Entry(JobKind.BATCH, Queue.BATCH, since=1000.0, seen=1000.0)
    assert moves == []
    book, moves = advance(book, jobs, 1150.0, adapt_every=10)
    assert book.jobs["b"].executed_s == 150
    book, moves = advance(book, jobs, 1200.0, adapt_every=10)
    assert [(m.old, m.new) for m in moves] == [(Queue.BATCH, Queue.LONG)]
    assert book.jobs["b"] == Entry(JobKind.BATCH, Queue.LONG, since=1200.0, seen=1200.0)

    # Stripped of every GPU, waiting: starved time counts; running, it does not.
    waiting = {"b": job("b", BATCH, pod("b-1", gated=True))}
    book, moves = advance(book, waiting, 1230.0, adapt_every=10)
    assert (book.jobs["b"].starved_s, moves) == (30, [])
    book, _ = advance(book, jobs, 1300.0, adapt_every=10)
    assert book.jobs["b"].starved_s == 30
    book, moves = advance(book, waiting, 1320.0, adapt_every=10)
    assert [(m.old, m.new) for m in moves] == [(Queue.LONG, Queue.BATCH)]
    assert "starved 50s" in moves[0].reason
    assert book.jobs["b"].starved_s == 0


def test_a_job_between_two_pods_keeps_its_queue_until_forgotten() -> None:
    """Its pod evicted, a Deployment's replacement comes back to the queue the job was in."""
    book = Book({"b": Entry(JobKind.BATCH, Queue.LONG, since=0.0, seen=100.0)}, T)
    book, _ = advance(book, {}, 110.0, adapt_every=10)
    assert book.jobs["b"].queue is Queue.LONG
    back = {"b": job("b", BATCH, pod("b-1", gated=True))}
    again, _ = advance(book, back, 120.0, adapt_every=10)
    assert again.jobs["b"].queue is Queue.LONG
    assert names(release(back, again, room(0))) == []
    gone, _ = advance(book, {}, 100.0 + FORGET_AFTER_S, adapt_every=10)
    assert "b" not in gone.jobs


def test_an_interactive_job_running_too_long_is_demoted_to_batch() -> None:
    jobs = {"c": job("c", INTERACTIVE, running("c-0"))}
    book, _ = advance(Book({}, T), jobs, 0.0, adapt_every=10)
    book, moves = advance(book, jobs, 101.0, adapt_every=10)
    assert [(m.old, m.new) for m in moves] == [(Queue.INTERACTIVE, Queue.BATCH)]


def test_completions_are_counted_once_and_adapt_the_thresholds() -> None:
    book = Book({}, T)
    done = PodObs("ns", "x-0", "u", 1, 0.0, False, True, "Succeeded", started=10, finished=70)
    for i in range(3):
        jobs = {f"j{i}": job(f"j{i}", BATCH, done)}
        book, _ = advance(book, jobs, 100.0 + i, adapt_every=3)
        book, _ = advance(book, jobs, 110.0 + i, adapt_every=3)  # seen again: not recounted
    # Three batch completions of 60 s: the promotion threshold is twice their mean.
    assert book.thresholds == Thresholds(100.0, 200.0, 120.0)
    assert book.means.since_update == 0
    failed = PodObs("ns", "f-0", "uf", 1, 0.0, False, True, "Failed", started=0, finished=40)
    jobs = {"f": job("f", BATCH, failed, running("f-1"))}
    book, _ = advance(book, jobs, 200.0, adapt_every=3)
    book, _ = advance(book, jobs, 210.0, adapt_every=3)
    assert (book.means.rttf_n, book.means.rttf_sum) == (1, 40.0)


def test_the_book_survives_its_json_and_a_bad_one_starts_afresh() -> None:
    book = Book(
        {"b": Entry(JobKind.BATCH, Queue.LONG, 5.0, 1.5, 2.5, True, 7.0)},
        T,
        failures=frozenset({"u1"}),
        updated=9.0,
    )
    configured = Thresholds(1, 2, 3)
    assert book_from_json(book_to_json(book, configured), configured) == book
    assert book_from_json({"jobs": "nonsense"}, T) == Book({}, T)


def test_a_changed_setting_wins_over_the_stored_thresholds() -> None:
    """A book written under one setting keeps its adapted thresholds while the setting stays;
    once the admin changes the setting, the new one holds (jobs and means kept). A book that
    does not say under which setting it was written takes the setting too."""
    adapted = Thresholds(10, 20, 30)
    book = Book({"b": Entry(JobKind.BATCH, Queue.LONG, 5.0, 1.5, 2.5)}, adapted,
                Means(1.0, 1, 2.0, 1, 3.0, 1, 3))  # fmt: skip
    old, new = Thresholds(1, 2, 3), Thresholds(4, 4, 4)
    stored = book_to_json(book, old)
    assert book_from_json(stored, old).thresholds == adapted
    changed = book_from_json(stored, new)
    assert changed.thresholds == new
    assert (changed.jobs, changed.means) == (book.jobs, book.means)
    legacy = {k: v for k, v in stored.items() if k != "configured"}
    assert book_from_json(legacy, new).thresholds == new


def gpu_pod(name: str, annotations: dict[str, str], *, gate: bool = True) -> dict[str, Any]:
    obj = builders.pod(name, 2, namespace="ns", extra_annotations=annotations)
    obj["metadata"]["creationTimestamp"] = rfc3339(1_800_000_000)
    if gate:
        obj["spec"]["schedulingGates"] = [{"name": "other"}, {"name": contract.SCHEDULING_GATE}]
    obj["status"] = {"phase": "Pending"}
    return obj


def test_only_pods_declaring_their_class_are_the_queues_and_jobs_group_by_owner() -> None:
    cls = {contract.ANN_JOB_CLASS: "batch", contract.ANN_OWNER: "train"}
    jobs = observe(
        [
            gpu_pod("a", cls),
            gpu_pod("b", cls, gate=False),
            gpu_pod("c", {contract.ANN_JOB_CLASS: "interactive"}),
            gpu_pod("d", {}),  # no class: untouched
        ],
        contract.DEFAULT_GPU_RESOURCE,
    )
    assert set(jobs) == {"ns/train", "ns/c"}
    assert [(p.name, p.gated, p.gpus) for p in jobs["ns/train"].pods] == [
        ("a", True, 2),
        ("b", False, 2),
    ]
    assert jobs["ns/c"].cls.kind is JobKind.INTERACTIVE
    assert jobs["ns/train"].pods[0].created == 1_800_000_000
