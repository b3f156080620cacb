"""kubectl against the test API server, as its admin or as the holder of a token."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from typing import Any

from tests.apiserver.conftest import ApiServer
from tests.chart import binary


@dataclass
class Kubectl:
    apiserver: ApiServer

    def run(
        self, *args: str, token: str | None = None, stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """kubectl as the admin, or as the holder of ``token``."""
        auth = (
            ["--server", self.apiserver.server, "--certificate-authority",
             str(self.apiserver.ca), "--token", token]
            if token is not None
            else ["--kubeconfig", str(self.apiserver.kubeconfig)]
        )  # fmt: skip
        return subprocess.run(
            [binary("kubectl"), *auth, *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    def kubectl(self, *args: str, token: str | None = None, stdin: str | None = None) -> str:
        done = self.run(*args, token=token, stdin=stdin)
        assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr}"
        return done.stdout

    def refused(self, token: str, *args: str, stdin: str | None = None) -> str:
        """The error of a request the token's holder must not be able to make."""
        done = self.run(*args, token=token, stdin=stdin)
        assert done.returncode != 0, f"allowed, must be refused: {' '.join(args)}: {done.stdout}"
        return done.stderr

    def can(self, token: str, verb: str, resource: str, namespace: str = "") -> bool:
        """`kubectl auth can-i` as the token's holder (a SelfSubjectAccessReview)."""
        ns = ["-n", namespace] if namespace else ["-A"]
        resource, _, sub = resource.partition("/")  # pods/binding: a subresource, not a name
        subresource = ["--subresource", sub] if sub else []
        done = self.run("auth", "can-i", verb, resource, *subresource, *ns, token=token)
        if "doesn't have a resource type" in done.stderr and "." in resource:
            # A resource this API server does not serve (a CRD not installed, an alpha API
            # off): kubectl then asks for the whole name as a core resource, so ask directly.
            return self._review(token, verb, resource, sub, namespace)
        answer = done.stdout.strip()
        assert answer in ("yes", "no"), f"can-i {verb} {resource}: {done.stdout} {done.stderr}"
        return answer == "yes"

    def _review(self, token: str, verb: str, resource: str, sub: str, namespace: str) -> bool:
        """A SelfSubjectAccessReview of ``RESOURCE.GROUP`` as the token's holder."""
        name, _, group = resource.partition(".")
        attributes = {"verb": verb, "resource": name, "group": group, "namespace": namespace}
        if sub:
            attributes["subresource"] = sub
        review = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": attributes},
        }
        out = self.kubectl(
            "create",
            "--validate=false",
            "-f",
            "-",
            "-o",
            "json",
            token=token,
            stdin=json.dumps(review),
        )
        return bool(json.loads(out)["status"]["allowed"])

    def apply(self, obj: dict[str, Any]) -> None:
        """Create or update ``obj`` as the admin."""
        self.kubectl("apply", "-f", "-", stdin=json.dumps(obj))
