"""Deliberate bugs for the soak to catch: each names the checker that must report it.

``hack/soak.py --mutate NAME`` starts the cluster's tidelease processes (the extenders, the
controllers and the real node's agent) with tests/hooks on their PYTHONPATH and
``TIDELEASE_SOAK_MUTATION=NAME``: its ``sitecustomize`` patches the bug into them before they
start, and into nothing else. The run then passes only when the checker named here reported
at least one violation, so a green soak means something: the checkers see the bugs that matter
when they happen in the system, not only in the histories of tests/unit/test_soak_invariants.py.
The agent's mutations (``sticky-full``) need ``--real-node``.
"""

from __future__ import annotations

from dataclasses import dataclass

ENV = "TIDELEASE_SOAK_MUTATION"


@dataclass(frozen=True)
class Mutation:
    checker: str  # the checker that must report it
    what: str
    minutes: float = 4.0  # a run long enough for it to show
    real_node: bool = False  # a bug of the real node's agent (tests/hooks: AGENT_MUTATIONS)


MUTATIONS = {
    "skip-notice": Mutation(
        "notice-before-eviction", "the leasing controller evicts borrowers without the notice"
    ),
    "skip-ledger": Mutation(
        "ledger-matches-pods", "the extender binds pods without writing their ledger entries"
    ),
    "wrong-return": Mutation(
        "reclaim-ends",
        "a returning StatefulSet replica is placed as the reclaim of the next replica's group",
    ),
    "refuse-fours": Mutation(
        "pending-while-free", "the extender's filter turns every 4-GPU pod away from every node"
    ),
    "skip-release": Mutation(
        "queued-released", "the queues controller never releases a pod its gate holds"
    ),
    "split-gangs": Mutation(
        "gang-whole",
        "a reclaim evicts only the gang members on the devices it takes back, and the gang "
        "controller evicts nobody",
        minutes=8.0,  # seed 1: three gangs left in part (t=214, 265, 393 s)
    ),
    "sticky-full": Mutation(
        "prewarm-recovers",
        "the real node's agent, once it has seen its cache disk full, takes it as full for ever "
        "(a free-space figure never measured again)",
        minutes=5.0,  # seed 1: the disk full at t=91, a scale-up to prewarm with room at t=201
        real_node=True,
    ),
    "leak": Mutation(
        "leak-trend", "the extender keeps 256 KiB of every filter request forever", minutes=12.0
    ),
}
