#!/usr/bin/env python3
"""Soak run: compressed tides on a local cluster of its own, with faults, invariants checked
over the whole history (issue 33).

usage: hack/soak.py [--minutes 60] [--seed S] [--dir DIR] [--nodes 6] [--json FILE] [--plan]
                    [--mutate NAME] [--real-node]

Starts hack/cluster-up.sh (foreground, following this process) in DIR (default: a temporary
directory, removed afterwards; a DIR given is kept, with every component's log) with --nodes
kwok GPU nodes, then plays the seed's plan (tests/soak/workload.py): online jobs (StatefulSets
and a Deployment, each with a GpuLease) lending and reclaiming every few minutes, borrowers of
a few namespaces arriving and finishing at random (single pods, pods of the shared queues,
gangs), and faults at random moments: kill -9 of the
controllers, of the extender and of kube-apiserver (each restarted as it ran), etcd paused for
seconds, a kwok node deleted with its pods (made again a minute later). The cluster is
observed every second and the invariants of tests/soak/invariants.py are checked throughout.

The seed decides everything the run does (the plan and its fault schedule are printed at the
start); a failing run prints its seed and schedule: run that seed again to replay it. The
report: faults by kind, reclaims and their p50/p99 time, violations (time and message), and
memory and fd slopes of the extenders and the controllers. Exit 1 on any violation, 2 when
the harness itself failed (a fault it could not do, a cluster that did not start).

``--real-node`` adds a real kubelet node (hack/realnode.sh: containerd, the kubelet and the
tidelease agent with 8 fake GPUs, its peer cache on a 64 MiB disk of its own) with an online job
that writes a checkpoint at each scale-down and prewarms it from a peer (tests/soak/peercache.py)
before each scale-up, borrowers, agent kills and a full cache disk of its own
(tests/soak/workload.py); its pods run for real.

``--mutate NAME`` runs the cluster's tidelease processes with a deliberate bug
(tests/soak/mutations.py) and turns the verdict around: exit 0 when the checker that must see
that bug reported it, 1 when it did not.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VENV_PY = ROOT / ".venv" / "bin" / "python"

if VENV_PY.exists() and Path(sys.prefix).resolve() != (ROOT / ".venv").resolve():
    # the project's environment (hack/lib/python.sh creates it)
    os.execv(str(VENV_PY), [str(VENV_PY), *sys.argv])
sys.path.insert(0, str(ROOT))

from tests.background import read_state  # noqa: E402 (the project's environment, as above)
from tests.e2e.harness import Cluster  # noqa: E402
from tests.soak.mutations import ENV as MUTATION_ENV  # noqa: E402
from tests.soak.mutations import MUTATIONS  # noqa: E402
from tests.soak.runner import CACHE_DISK_MIB, CLUSTER_ENV, Runner, log, write_json  # noqa: E402
from tests.soak.workload import plan  # noqa: E402

START_TIMEOUT_S = 600
REAL_NODE_GPUS = 8


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--minutes", type=float, default=60.0)
    p.add_argument("--seed", type=int, help="default: a random one (printed)")
    p.add_argument("--dir", type=Path, help="the cluster's directory, kept (default: temporary)")
    p.add_argument("--nodes", type=int, default=6, help="kwok GPU nodes (8 GPUs each)")
    p.add_argument("--json", type=Path, help="also write the report here")
    p.add_argument("--plan", action="store_true", help="print the seed's plan only (no cluster)")
    p.add_argument("--mutate", choices=sorted(MUTATIONS), help="run with this deliberate bug")
    p.add_argument(
        "--real-node",
        action="store_true",
        help=f"also a real kubelet node ({REAL_NODE_GPUS} fake GPUs; root, containerd)",
    )
    args = p.parse_args()
    if args.minutes < 1:
        p.error("--minutes: at least 1")
    if args.mutate and MUTATIONS[args.mutate].real_node and not args.real_node:
        p.error(f"--mutate {args.mutate}: a mutation of the real node's agent needs --real-node")
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**31)
    real_gpus = REAL_NODE_GPUS if args.real_node else 0
    the_plan = plan(seed, args.minutes, nodes=args.nodes, real_node_gpus=real_gpus)
    if args.plan:
        print("\n".join(the_plan.describe()))
        return 0

    # SIGTERM unwinds as Ctrl-C does: the restarted processes are stopped, and the cluster
    # follows its parent (TL_CLUSTER_PARENT_PID).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    keep = args.dir is not None
    base: Path | None = None
    if args.dir is not None:
        cluster_dir = args.dir.resolve()
        log_path = cluster_dir.with_name(f"{cluster_dir.name}.cluster-up.log")
    else:
        base = Path(tempfile.mkdtemp(prefix="tidelease-soak."))
        cluster_dir, log_path = base / "cluster", base / "cluster-up.log"
    state = cluster_dir / "cluster.env"
    env = {
        **os.environ,
        **CLUSTER_ENV,
        "TL_CLUSTER_DIR": str(cluster_dir),
        "TL_CLUSTER_NODES": str(args.nodes),
        "TL_CLUSTER_PARENT_PID": str(os.getpid()),
        "TL_CLUSTER_KEEP_DIR": "true" if keep else "false",
        "TL_CLUSTER_REAL_NODE": "true" if args.real_node else "false",
        "TL_CLUSTER_REAL_NODE_GPUS": str(REAL_NODE_GPUS),
        # its agent's peer cache on a disk of its own, which disk-full fills
        "TL_CLUSTER_REAL_NODE_CACHE_MIB": str(CACHE_DISK_MIB) if args.real_node else "",
        "TL_CLUSTER_REAL_DRA_NODE": "false",
    }
    if args.mutate:
        mutation = MUTATIONS[args.mutate]
        log(f"mutation {args.mutate}: {mutation.what}; {mutation.checker} must report it")
        env[MUTATION_ENV] = args.mutate
        mutants = str(ROOT / "tests" / "hooks")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [mutants, env.get("PYTHONPATH")]))
    log(f"seed {seed}: starting a cluster with {args.nodes} kwok GPU nodes in {cluster_dir}")
    t0 = time.monotonic()
    with log_path.open("w") as out:
        proc = subprocess.Popen(
            [str(ROOT / "hack" / "cluster-up.sh"), "-f", "-D", str(cluster_dir)],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
        )
    runner = None
    try:
        while not state.exists():
            if proc.poll() is not None or time.monotonic() - t0 > START_TIMEOUT_S:
                sys.stderr.write(log_path.read_text()[-4000:])
                log("the cluster did not start (binaries missing? run hack/build-binaries.sh)")
                return 2
            time.sleep(0.5)
        log(f"cluster up in {time.monotonic() - t0:.0f} s")
        facts = read_state(state)
        runner = Runner(Cluster.from_state(facts), facts, the_plan, args.minutes)
        report = runner.run()
    finally:
        if runner is not None:
            runner.close()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=180)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if base is not None:
            with contextlib.suppress(OSError):
                shutil.rmtree(base)
    for line in report.lines():
        print(line, flush=True)
    if args.json:
        write_json(report, args.json)
    if args.mutate:
        checker = MUTATIONS[args.mutate].checker
        caught = [v for v in report.violations if v.startswith(f"[{checker}]")]
        log(f"mutation {args.mutate}: {len(caught)} violation(s) of {checker}")
        return 0 if caught else 1
    if report.violations:
        return 1
    return 2 if report.errors else 0


if __name__ == "__main__":
    sys.exit(main())
