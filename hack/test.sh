#!/usr/bin/env bash
# The whole test suite, as CI runs it: lint (ruff), types (mypy --strict), then every test,
# including those that need a real kube-apiserver, the local cluster and its real kubelet node
# (binaries built here on first use, then cached) and a real containerd (Debian's packages,
# installed here when missing; containerd 2.x for the real node in DRA mode, built and cached
# like the Kubernetes binaries).
#
# usage: hack/test.sh [pytest args...]
#   TIDELEASE_SKIP_BUILD=1   do not build the Kubernetes binaries (and helm, promtool); tests that
#                            need them fail
set -o errexit -o nounset -o pipefail

source "$(dirname "${BASH_SOURCE[0]}")/lib/python.sh"
source "$(dirname "${BASH_SOURCE[0]}")/lib/containerd.sh"

usage() { sed -n '2,10p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then usage; exit 0; fi

cd "${TL_ROOT}"
tl::py::ensure

if [[ "${TIDELEASE_SKIP_BUILD:-}" != "1" ]]; then
  "${TL_HACK}/build-binaries.sh" etcd kube-apiserver kubectl kube-scheduler kube-controller-manager kubelet kwok \
    helm promtool containerd containerd-shim-runc-v2 ctr kueue
fi
tl::ctrd::ensure_packages

tl::log "ruff"
"${TL_VENV}/bin/ruff" check common extender nodeagent tests benchmarks hack
"${TL_VENV}/bin/ruff" format --check common extender nodeagent tests benchmarks hack
tl::log "mypy --strict"
"${TL_VENV}/bin/mypy"
tl::log "pytest"
exec "${TL_PY}" -m pytest "$@"
