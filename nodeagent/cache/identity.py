"""Who a peer is: the verdict on a TokenReview of the token it presented. Pure.

A peer proves who it is with its pod's projected ServiceAccount token, issued for the cache's own
audience (``tidelease-peer-cache``, not the API server's) and bound to its pod, so to its node.
The serving agent asks the API server to review the token for that audience; this module reads
the answer: the token must be authenticated for the audience, name the agent's ServiceAccount,
and carry the node it was issued on (``authentication.kubernetes.io/node-name``, set by
Kubernetes 1.30+ on tokens bound to a pod). Anything else is refused, and the reason says why.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, NewType

NodeName = NewType("NodeName", str)

DEFAULT_AUDIENCE: Final = "tidelease-peer-cache"
NODE_NAME_EXTRA: Final = "authentication.kubernetes.io/node-name"
POD_NAME_EXTRA: Final = "authentication.kubernetes.io/pod-name"


def service_account_user(namespace: str, name: str) -> str:
    """The user name a ServiceAccount's tokens authenticate as."""
    return f"system:serviceaccount:{namespace}:{name}"


@dataclass(frozen=True, slots=True)
class PeerIdentity:
    node: NodeName
    user: str
    pod: str | None = None

    def __str__(self) -> str:
        pod = f", pod {self.pod}" if self.pod else ""
        return f"node {self.node} ({self.user}{pod})"


@dataclass(frozen=True, slots=True)
class PeerVerdict:
    """200: a peer (``identity`` set); 401: no or invalid token; 403: a valid token of someone
    who is not a peer; 429/503: cannot tell now (asked again next time)."""

    status: int
    reason: str
    identity: PeerIdentity | None = None

    @property
    def allowed(self) -> bool:
        return self.status == 200 and self.identity is not None


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, or None."""
    scheme, _, token = (authorization or "").partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    return token


def _first(values: Any) -> str | None:
    if isinstance(values, Sequence) and not isinstance(values, str) and values:
        first = values[0]
        return first if isinstance(first, str) and first else None
    return None


def judge_review(status: Mapping[str, Any], *, audience: str, user: str) -> PeerVerdict:
    """The verdict on a TokenReview's ``status`` for a token that must be valid for ``audience``
    and belong to ``user`` (the agents' ServiceAccount), bound to a pod on a node."""
    if not status.get("authenticated"):
        error = status.get("error")
        detail = f": {error}" if isinstance(error, str) and error else ""
        return PeerVerdict(401, f"the token is not valid for {audience}{detail}")
    audiences = status.get("audiences")
    # The API server answers with the audiences the token is valid for among those asked; a
    # server that ignores spec.audiences answers none, and its yes is not for this audience.
    if not isinstance(audiences, list) or audience not in audiences:
        return PeerVerdict(401, f"the token is not valid for {audience}")
    raw_user = status.get("user")
    who = raw_user if isinstance(raw_user, Mapping) else {}
    name = who.get("username")
    if name != user:
        return PeerVerdict(403, f"{name or 'an unnamed user'} is not a peer (want {user})")
    extra = who.get("extra")
    extra = extra if isinstance(extra, Mapping) else {}
    node = _first(extra.get(NODE_NAME_EXTRA))
    if node is None:
        return PeerVerdict(
            403, f"{user}'s token is not bound to a pod on a node (no {NODE_NAME_EXTRA})"
        )
    identity = PeerIdentity(NodeName(node), user, _first(extra.get(POD_NAME_EXTRA)))
    return PeerVerdict(200, "ok", identity)
