"""The prelaunch window W of a node: how long before a scaling event the node's preparation
must start so that it is ready in time. Pure.

Before a scaling event, a node that will run a job needs its image and checkpoint local and the
checkpoint loaded onto its GPUs. The time that takes, from the node's cache state and the
bandwidths on the way:

    T_img  = (1 - eta_cache) * S_img  / min(B_net, B_reg)                        (1)
    T_ckpt = (1 - eta_ckpt)  * S_ckpt / min(B_net, B_stor) + S_ckpt / B_gpu      (2)
    W      = T_gpu_adj + max(T_img, T_ckpt)                                      (3)

eta are the local cache hit ratios (1: all present, 0: nothing), S sizes in bytes, B bandwidths
in bytes per second (network, registry, checkpoint storage, GPU interconnect), T_gpu_adj the
time to move GPU capacity (lend/reclaim). Image and checkpoint are fetched in parallel, hence
the max. A node whose image and checkpoint are both cached has W = T_gpu_adj + S_ckpt / B_gpu:
the "virtually zero restart latency" (the paper's words) of reclaimed original nodes.

Reference: weflex 3.3, equations 1-3 (docs/references.md).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Bandwidths:
    """Bytes per second."""

    net: float
    registry: float
    storage: float
    gpu: float


@dataclass(frozen=True, slots=True)
class PrelaunchInputs:
    image_bytes: float
    checkpoint_bytes: float
    image_hit: float  # eta_cache, 0..1
    checkpoint_hit: float  # eta_ckpt, 0..1
    bandwidths: Bandwidths
    gpu_adjust_s: float = 0.0  # T_gpu_adj

    def validate(self) -> list[str]:
        problems = []
        for name in ("image_bytes", "checkpoint_bytes", "gpu_adjust_s"):
            if getattr(self, name) < 0:
                problems.append(f"{name} must be >= 0")
        for name in ("image_hit", "checkpoint_hit"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                problems.append(f"{name} must be within [0, 1]")
        b = self.bandwidths
        for name in ("net", "registry", "storage", "gpu"):
            if getattr(b, name) <= 0:
                problems.append(f"bandwidth {name} must be positive")
        return problems


@dataclass(frozen=True, slots=True)
class PrelaunchWindow:
    image_s: float  # T_img^pre
    checkpoint_s: float  # T_ckpt^pre
    gpu_adjust_s: float
    window_s: float  # W

    @property
    def bottleneck(self) -> str:
        return "image" if self.image_s >= self.checkpoint_s else "checkpoint"


def hit_ratio(present_bytes: float, total_bytes: float) -> float:
    """A cache hit ratio from what is present locally (1.0 for an empty object)."""
    if total_bytes <= 0:
        return 1.0
    return min(1.0, max(0.0, present_bytes / total_bytes))


def image_time(inp: PrelaunchInputs) -> float:
    """Equation (1)."""
    b = inp.bandwidths
    return (1.0 - inp.image_hit) * inp.image_bytes / min(b.net, b.registry)


def checkpoint_time(inp: PrelaunchInputs) -> float:
    """Equation (2): fetch what is missing, then load all of it onto the GPUs."""
    b = inp.bandwidths
    fetch = (1.0 - inp.checkpoint_hit) * inp.checkpoint_bytes / min(b.net, b.storage)
    return fetch + inp.checkpoint_bytes / b.gpu


def prelaunch_window(inp: PrelaunchInputs) -> PrelaunchWindow:
    """Equation (3). Inputs are assumed valid (:meth:`PrelaunchInputs.validate`)."""
    t_img, t_ckpt = image_time(inp), checkpoint_time(inp)
    return PrelaunchWindow(
        image_s=t_img,
        checkpoint_s=t_ckpt,
        gpu_adjust_s=inp.gpu_adjust_s,
        window_s=inp.gpu_adjust_s + max(t_img, t_ckpt),
    )


def for_node(
    *,
    image_present: bool,
    checkpoint_present: bool,
    image_bytes: float,
    checkpoint_bytes: float,
    bandwidths: Bandwidths,
    gpu_adjust_s: float = 0.0,
) -> PrelaunchWindow:
    """W for a node's cache state as the agent knows it (each object present or not)."""
    return prelaunch_window(
        PrelaunchInputs(
            image_bytes=image_bytes,
            checkpoint_bytes=checkpoint_bytes,
            image_hit=1.0 if image_present else 0.0,
            checkpoint_hit=1.0 if checkpoint_present else 0.0,
            bandwidths=bandwidths,
            gpu_adjust_s=gpu_adjust_s,
        )
    )
