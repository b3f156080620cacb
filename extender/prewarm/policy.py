"""Prewarming ahead of a predicted scale-up (weflex 3.3, "standby prelaunch"). Pure.

An online job's GpuLease says when it scales up (the next schedule entry with more GPUs, or a
``desiredGPUs`` above what its replicas hold). The nodes its new replicas will land on are known
before then: the nodes holding the lease's lent groups (right of return), and, for lent groups
that cannot come back (an unhealthy device, a node gone), standby nodes of the same GPU type and
tier. Each of those nodes is told to fetch what it lacks of the job's images and checkpoint, and
when: at ``T_scale - W(node) - margin``, where W is the node's prelaunch window (weflex
equations 1-3, :mod:`common.prelaunch`) from its cache state. A node holding the image and
the checkpoint has a tiny W and needs no directive; a cold node starts earlier.

A directive lives in the node's ``GpuNode.spec.prewarm`` (written by
:mod:`extender.prewarm.controller`); the node agent (:mod:`nodeagent.prewarm`) carries it out and
reports each item in ``GpuNode.status.prewarm`` (the format of both: :mod:`common.prewarmwire`).
:func:`plan_prewarm` computes the directives every node should hold now; a lease whose scale-up
happened (its replicas hold the target and it is not reclaiming), or that was deleted, has none,
so its directives are cleared.

Stability: directives are rewritten only when the decision changes. The items of a directive
already written stay in it while the workload still needs them (the agent reports them Done;
the node's inventory then lists them, which must not shrink the directive), its window is
computed from those items, and an ongoing scale-up keeps the time it was first given.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from common import contract
from common.coercion import whole
from common.errors import InvalidInput
from common.hotrestartwire import normalized
from common.model import (
    Device,
    GpuUuid,
    Holder,
    NodeCache,
    NodeInventory,
    PodRequest,
    PodUid,
    Priority,
    Tier,
)
from common.prelaunch import Bandwidths, PrelaunchInputs, PrelaunchWindow, prelaunch_window
from common.prewarmwire import (
    Directive,
    Role,
)
from common.timefmt import microtime
from extender.leasing.decisions import View, scale_up_groups
from extender.rightofreturn.lease import GpuLease, LentGroup
from extender.rightofreturn.rules import group_can_return, ordinal, replicas_for, target_gpus
from extender.scheduler.filtering import return_share
from extender.scheduler.placement import plan_node

GB = 1e9


@dataclass(frozen=True, slots=True)
class PrewarmSettings:
    """How early, and for how many nodes. Sizes are defaults for templates that do not say
    (``tidelease.io/image-bytes``, ``tidelease.io/checkpoint-bytes``); bandwidths in bytes/s."""

    bandwidths: Bandwidths = field(
        default_factory=lambda: Bandwidths(
            net=1.25 * GB, registry=0.5 * GB, storage=2 * GB, gpu=50 * GB
        )
    )
    image_bytes: float = 10 * GB
    checkpoint_bytes: float = 100 * GB
    gpu_adjust_s: float = 0.0  # T_gpu_adj of equation 3
    margin_s: float = 120.0  # started this much before T_scale - W
    horizon_s: float = 3600.0  # directives are written at most this long before they start
    spare_standby_replicas: int = 1  # standby nodes prewarmed beyond the backfill need
    stale_s: float = 3600.0  # an ongoing scale-up older than this gets no more directives

    def validate(self) -> list[str]:
        problems = []
        b = self.bandwidths
        for name in ("net", "registry", "storage", "gpu"):
            if not getattr(b, name) > 0:
                problems.append(f"prewarm bandwidth {name} must be positive")
        for name in ("image_bytes", "checkpoint_bytes", "gpu_adjust_s", "margin_s", "horizon_s"):
            if getattr(self, name) < 0:
                problems.append(f"prewarm {name} must be >= 0")
        if self.spare_standby_replicas < 0:
            problems.append("prewarm spare_standby_replicas must be >= 0")
        if self.stale_s <= 0:
            problems.append("prewarm stale_s must be positive")
        return problems


# --- the workload's pod template ---


@dataclass(frozen=True, slots=True)
class WorkloadTemplate:
    """What a new replica of the workload needs on its node, and how many replicas it has."""

    replicas: int
    images: tuple[str, ...]
    checkpoint: str | None = None
    image_bytes: float | None = None  # None: the settings' default
    checkpoint_bytes: float | None = None


def _size(annotations: Mapping[str, Any], key: str, problems: list[str]) -> float | None:
    value = annotations.get(key)
    if value is None:
        return None
    try:
        size = float(str(value))
    except ValueError:
        size = -1.0
    if not size >= 0:
        problems.append(f"annotation {key} must be a number of bytes, got {value!r}")
        return None
    return size


def parse_workload(obj: Mapping[str, Any]) -> WorkloadTemplate:
    """The replicas and pod template of a workload (StatefulSet, Deployment, ...: anything with
    ``spec.replicas`` and ``spec.template``); InvalidInput names bad annotations."""
    spec = obj.get("spec") or {}
    template = spec.get("template") or {}
    meta = template.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    pod_spec = template.get("spec") or {}
    images: list[str] = []
    for key in ("initContainers", "containers"):
        for c in pod_spec.get(key) or []:
            image = c.get("image") if isinstance(c, dict) else None
            if isinstance(image, str) and image and image not in images:
                images.append(image)
    problems: list[str] = []
    image_bytes = _size(annotations, contract.ANN_IMAGE_BYTES, problems)
    checkpoint_bytes = _size(annotations, contract.ANN_CHECKPOINT_BYTES, problems)
    if problems:
        name = (obj.get("metadata") or {}).get("name")
        raise InvalidInput([f"workload {name}: {p}" for p in problems])
    checkpoint = annotations.get(contract.ANN_CHECKPOINT)
    replicas = spec.get("replicas")
    return WorkloadTemplate(
        replicas=replicas if whole(replicas) else 1,
        images=tuple(images),
        checkpoint=checkpoint if isinstance(checkpoint, str) and checkpoint else None,
        image_bytes=image_bytes,
        checkpoint_bytes=checkpoint_bytes,
    )


# --- the decision ---


@dataclass(frozen=True, slots=True)
class ScaleUp:
    """A lease's scale-up, upcoming or under way."""

    lease: str
    at: float  # T_scale
    replicas_now: int
    replicas_target: int
    groups: tuple[LentGroup, ...]  # the lent groups it takes back
    ongoing: bool  # its time has come (the reclaim may be under way)


@dataclass(frozen=True, slots=True)
class NodeDecision:
    node: str
    role: Role
    window: PrelaunchWindow
    directive: Directive | None  # None: nothing to fetch, or not yet within the horizon
    why: str
    # The lent groups (by replica) this node holds and is warmed for: where those replicas
    # land (extender.scheduler.returning sends each to the node holding its group).
    groups: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class LeasePlan:
    lease: str
    scale_up: ScaleUp | None
    nodes: tuple[NodeDecision, ...] = ()
    why: str = ""


@dataclass(frozen=True, slots=True)
class PrewarmPlan:
    by_node: Mapping[str, tuple[Directive, ...]]  # every node's directives, sorted by lease
    leases: tuple[LeasePlan, ...]


def _at(day: datetime, minute: int) -> float:
    return (day + timedelta(minutes=minute)).timestamp()


def _entry_times(lease: GpuLease, now: float) -> tuple[float | None, float | None, int]:
    """(start of the schedule entry in force, start of the next one, the next one's GPUs)."""
    schedule = sorted(lease.spec.schedule, key=lambda e: e.minute_of_day)
    if not schedule:
        return None, None, 0
    t = datetime.fromtimestamp(now, UTC)
    midnight = t.replace(hour=0, minute=0, second=0, microsecond=0)
    minute = t.hour * 60 + t.minute
    past = [e for e in schedule if e.minute_of_day <= minute]
    start = (
        _at(midnight, past[-1].minute_of_day)
        if past
        else _at(midnight - timedelta(days=1), schedule[-1].minute_of_day)
    )
    later = [e for e in schedule if e.minute_of_day > minute]
    nxt = later[0] if later else schedule[0]
    day = midnight if later else midnight + timedelta(days=1)
    return start, _at(day, nxt.minute_of_day), nxt.gpus


def scale_up_of(
    lease: GpuLease,
    template: WorkloadTemplate,
    view: View,
    now: float,
    *,
    since: float | None = None,
) -> tuple[ScaleUp | None, str]:
    """The lease's scale-up to prepare for, if any, and why (not).

    Ongoing: the lease is reclaiming, or the GPUs in force exceed what its replicas hold.
    Upcoming: the next schedule entry raises the replicas. Only one is prepared at a time: an
    ongoing one first. ``since``: the time an ongoing scale-up was first given (its existing
    directives' deadline), kept so that the directives do not move.
    """
    spec, status = lease.spec, lease.status
    per = spec.gpus_per_replica
    have = template.replicas
    if status.phase == "Reclaiming":
        target = status.target_replicas if status.target_replicas is not None else have
        groups = tuple(g for g in status.groups if g.replica in status.reclaiming)
        at = since if since is not None else status.reclaim_started or now
        return ScaleUp(lease.key, at, have, target, groups, True), "reclaiming"
    want = replicas_for(target_gpus(spec.desired_gpus, spec.schedule, now), per)
    start, nxt, nxt_gpus = _entry_times(lease, now)
    if want > have:
        at = since if since is not None else start if start is not None else now
        groups = scale_up_groups(lease, have, want, view)[1]
        return (
            ScaleUp(lease.key, at, have, want, groups, True),
            f"{have} replica(s) now, {want} wanted",
        )
    if nxt is not None and replicas_for(nxt_gpus, per) > have:
        target = replicas_for(nxt_gpus, per)
        groups = scale_up_groups(lease, have, target, view)[1]
        return (
            ScaleUp(lease.key, nxt, have, target, groups, False),
            f"scale-up {have} -> {target} replica(s) at {microtime(nxt)}",
        )
    return None, "no scale-up ahead"


def _present(image: str, cache: NodeCache) -> bool:
    return normalized(image) in {normalized(i) for i in cache.images}


def node_window(
    template: WorkloadTemplate,
    missing_images: Sequence[str],
    missing_checkpoint: bool,
    settings: PrewarmSettings,
) -> PrelaunchWindow:
    """W of a node that lacks ``missing_images`` (and the checkpoint, if ``missing_checkpoint``):
    equations 1-3 with the hit ratios of what it holds (images counted by number)."""
    images = template.images
    image_bytes = template.image_bytes if template.image_bytes is not None else settings.image_bytes
    ckpt_bytes = 0.0
    if template.checkpoint is not None:
        ckpt_bytes = (
            template.checkpoint_bytes
            if template.checkpoint_bytes is not None
            else settings.checkpoint_bytes
        )
    image_hit = 1.0 - len(missing_images) / len(images) if images else 1.0
    return prelaunch_window(
        PrelaunchInputs(
            image_bytes=image_bytes if images else 0.0,
            checkpoint_bytes=ckpt_bytes,
            image_hit=min(1.0, max(0.0, image_hit)),
            checkpoint_hit=0.0 if missing_checkpoint else 1.0,
            bandwidths=settings.bandwidths,
            gpu_adjust_s=settings.gpu_adjust_s,
        )
    )


def _decide_node(
    node: NodeInventory,
    role: Role,
    why: str,
    scale_up: ScaleUp,
    template: WorkloadTemplate,
    existing: Directive | None,
    settings: PrewarmSettings,
    now: float,
) -> NodeDecision:
    same = existing is not None and microtime(existing.deadline) == microtime(scale_up.at)
    kept = existing if same else None
    images = [
        i
        for i in template.images
        if not _present(i, node.cache) or (kept is not None and i in kept.images)
    ]
    ckpt = template.checkpoint
    checkpoints = (
        [ckpt]
        if ckpt is not None
        and (ckpt not in node.cache.checkpoints or (kept is not None and ckpt in kept.checkpoints))
        else []
    )
    window = node_window(template, images, bool(checkpoints), settings)
    if not images and not checkpoints:
        return NodeDecision(node.node, role, window, None, f"{why}; holds everything already")
    not_before = scale_up.at - window.window_s - settings.margin_s
    if kept is None and now < not_before - settings.horizon_s:
        return NodeDecision(
            node.node, role, window, None, f"{why}; starts at {microtime(not_before)}, not yet"
        )
    directive = Directive(
        lease=scale_up.lease,
        role=role,
        images=tuple(images),
        checkpoints=tuple(checkpoints),
        not_before=not_before,
        deadline=scale_up.at,
        window_s=window.window_s,
    )
    return NodeDecision(node.node, role, window, directive, why)


def _type_tier(devices: Iterable[Device]) -> tuple[str, Tier] | None:
    counts = Counter((d.gpu_type, d.tier) for d in devices)
    return max(sorted(counts), key=lambda k: counts[k]) if counts else None


def _stand_in(lease: GpuLease, per: int, key: tuple[str, Tier] | None) -> PodRequest:
    """The owner's reclaim pod for a replica whose lent group cannot come back: what the
    extender's filter will place on standby devices of ``key``'s type and tier (or better)."""
    return PodRequest(
        namespace=lease.namespace,
        name=f"{lease.spec.owner}-stand-in",
        uid=PodUid(""),
        gpus=per,
        priority=Priority.HIGH,
        owner=lease.spec.owner,
        min_tier=Tier.LA if key is None else key[1],
        gpu_type=None if key is None else key[0],
        reclaim=True,
    )


def cluster_view(
    nodes: Mapping[str, NodeInventory], holders: Mapping[GpuUuid, Holder] | None = None
) -> View:
    """The devices of ``nodes`` (all offering) and their holders, as the leasing controller
    sees them: the same for every lease of one step."""
    devices: dict[GpuUuid, Device] = {d.uuid: d for n in nodes.values() for d in n.devices}
    return View(devices, holders or {}, dict.fromkeys(nodes, True))


def plan_lease(
    lease: GpuLease,
    template: WorkloadTemplate,
    nodes: Mapping[str, NodeInventory],
    current: Mapping[str, Sequence[Directive]],
    settings: PrewarmSettings,
    now: float,
    holders: Mapping[GpuUuid, Holder] | None = None,
    *,
    view: View | None = None,
) -> LeasePlan:
    """The nodes to prewarm for one lease, what and when, with the reasons. ``holders``: who
    holds each allocated device (the ledgers), so that the lent groups are chosen as the leasing
    controller will choose them (fewest borrowers first). ``view``: :func:`cluster_view` of
    ``nodes`` and ``holders``, when the caller plans several leases over one cluster (made
    here otherwise)."""
    view = view if view is not None else cluster_view(nodes, holders)
    devices = view.devices
    mine = {
        node: d for node, ds in current.items() for d in ds if d.lease == lease.key
    }  # this lease's directives, by node
    since = min((d.deadline for d in mine.values()), default=None)
    scale_up, why = scale_up_of(lease, template, view, now, since=since)
    if scale_up is None:
        return LeasePlan(lease.key, None, (), why)
    if scale_up.ongoing and now > scale_up.at + settings.stale_s:
        return LeasePlan(lease.key, None, (), f"{why}; scale-up older than {settings.stale_s} s")
    decisions: list[NodeDecision] = []
    broken: list[LentGroup] = []
    homes: dict[str, list[LentGroup]] = {}  # node -> the groups it holds
    for g in sorted(scale_up.groups, key=lambda g: (ordinal(g.replica), g.replica)):
        # the filter's rule (extender.scheduler.returning): the replica goes where its group is, if
        # the group can come back whole (borrowers on it are evicted by then)
        if not group_can_return(lease.spec.owner, g.devices, devices, view.holders, view.offering):
            broken.append(g)
            continue
        homes.setdefault(devices[g.devices[0]].node, []).append(g)
    for node, held_groups in sorted(homes.items()):
        names = tuple(g.replica for g in held_groups)
        count = sum(len(g.devices) for g in held_groups)
        decisions.append(
            replace(
                _decide_node(
                    nodes[node],
                    "Lent",
                    f"holds lent group(s) {', '.join(names)} ({count} device(s))",
                    scale_up,
                    template,
                    mine.get(node),
                    settings,
                    now,
                ),
                groups=names,
            )
        )
    taken = set(homes)
    # Replicas the lent groups cannot take (none lent, or broken) go to standby devices of the
    # lent devices' type and tier (the controller's backfill), plus a margin.
    lent_devices = [devices[u] for g in scale_up.groups for u in g.devices if u in devices]
    need: Counter[tuple[str, Tier] | None] = Counter()
    for g in broken:
        need[
            _type_tier(devices[u] for u in g.devices if u in devices) or _type_tier(lent_devices)
        ] += 1
    if need and settings.spare_standby_replicas:
        need[max(need, key=lambda k: need[k])] += settings.spare_standby_replicas
    per = lease.spec.gpus_per_replica
    held = holders or {}
    for key in sorted(need, key=lambda k: ("", 0) if k is None else (k[0], int(k[1]))):
        wanted = need[key]
        # The reclaim pod that will stand in for a group, and the nodes the extender's filter
        # would send it to first (its rule, filtering.return_share: the most standby devices,
        # of the best tiers); among equals, those holding the job's data already (smallest W),
        # then the largest.
        stand_in = _stand_in(lease, per, key)
        candidates: list[tuple[tuple[float, float, float], float, int, str]] = []
        for name, inv in nodes.items():
            if name in taken:
                continue
            free = [d for d in inv.devices if d.uuid not in held]
            fit = [
                d
                for d in free
                if d.cls.standby
                and d.cls.healthy
                and d.cls.owner in (None, lease.spec.owner)
                and (key is None or (d.gpu_type == key[0] and d.tier >= key[1]))
            ]
            capacity = len(fit) // per
            plan = plan_node(Counter(d.cls for d in free), stand_in)
            if capacity and plan.fits and plan.standby_used:
                w = _decide_node(
                    inv, "Standby", "", scale_up, template, mine.get(name), settings, now
                ).window.window_s
                candidates.append((return_share(plan, stand_in), w, capacity, name))
        what = "any type" if key is None else f"{key[0]}/{key[1].name}"
        ranked = sorted(candidates, key=lambda c: (tuple(-x for x in c[0]), c[1], -c[2], c[3]))
        for _, _, capacity, name in ranked:
            if wanted <= 0:
                break
            taken.add(name)
            wanted -= capacity
            decisions.append(
                _decide_node(
                    nodes[name],
                    "Standby",
                    f"standby for {need[key]} replica(s) of {what} "
                    f"({len(broken)} lent group(s) cannot come back)",
                    scale_up,
                    template,
                    mine.get(name),
                    settings,
                    now,
                )
            )
    return LeasePlan(lease.key, scale_up, tuple(decisions), why)


def plan_prewarm(
    leases: Iterable[GpuLease],
    templates: Mapping[str, WorkloadTemplate | None],
    nodes: Iterable[NodeInventory],
    current: Mapping[str, Sequence[Directive]],
    settings: PrewarmSettings,
    now: float,
    holders: Mapping[GpuUuid, Holder] | None = None,
) -> PrewarmPlan:
    """Every node's directives now.

    ``templates``: each lease's workload by lease key; None (or absent) when it could not be
    read this time: that lease's directives are kept as they are, unless stale. ``current``:
    the directives the nodes hold now (spec.prewarm). A directive of a lease not in ``leases``
    (deleted) is dropped.
    """
    by_name: dict[str, NodeInventory] = {n.node: n for n in nodes}
    out: dict[str, list[Directive]] = {name: [] for name in by_name}
    plans: list[LeasePlan] = []
    view = cluster_view(by_name, holders)  # once per step, not once per lease
    for lease in sorted(leases, key=lambda g: g.key):
        template = templates.get(lease.key)
        if template is None:
            for node, ds in current.items():
                for d in ds:
                    if d.lease == lease.key and now <= d.deadline + settings.stale_s:
                        out.setdefault(node, []).append(d)
            plans.append(LeasePlan(lease.key, None, (), "workload not readable; kept as is"))
            continue
        plan = plan_lease(lease, template, by_name, current, settings, now, holders, view=view)
        plans.append(plan)
        for decision in plan.nodes:
            if decision.directive is not None:
                out[decision.node].append(decision.directive)
    return PrewarmPlan(
        {node: tuple(sorted(ds, key=lambda d: d.lease)) for node, ds in out.items()},
        tuple(plans),
    )


def changes(
    current: Mapping[str, Sequence[Directive]], desired: Mapping[str, Sequence[Directive]]
) -> dict[str, tuple[Directive, ...]]:
    """The nodes whose spec.prewarm must be rewritten, with what (empty: remove it)."""
    out: dict[str, tuple[Directive, ...]] = {}
    for node in sorted(set(current) | set(desired)):
        want = tuple(desired.get(node, ()))
        # Compared as written: times to the microsecond, windows to the millisecond.
        if [d.to_json() for d in current.get(node, ())] != [d.to_json() for d in want]:
            out[node] = want
    return out
