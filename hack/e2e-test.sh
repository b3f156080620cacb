#!/usr/bin/env bash
# Run the e2e tests (tests/e2e, marker "cluster"): their session fixture starts a local cluster
# with hack/cluster-up.sh (four kwok GPU nodes, a real kubelet node on Debian's containerd, a
# second one in DRA mode on containerd 2.x, the real kube-scheduler and the extender) and stops
# it at the end. TIDELEASE_E2E_REAL_NODE=false leaves both real nodes out,
# TIDELEASE_E2E_REAL_DRA_NODE=false the DRA one (their tests then fail, saying so).
#
# usage: hack/e2e-test.sh [pytest args...]
#   BUILD=false   do not build missing binaries first (the tests then fail, saying which)
set -o errexit -o nounset -o pipefail

source "$(dirname "${BASH_SOURCE[0]}")/lib/python.sh"
source "$(dirname "${BASH_SOURCE[0]}")/lib/containerd.sh"

BUILD="${BUILD:-true}"

usage() { sed -n '2,9p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then usage; exit 0; fi

cd "${TL_ROOT}"
tl::py::ensure
if [[ "${BUILD}" == true ]]; then
  "${TL_HACK}/build-binaries.sh" etcd kube-apiserver kubectl kube-scheduler kube-controller-manager kubelet kwok \
    containerd containerd-shim-runc-v2 ctr kueue
fi
[[ "${TIDELEASE_E2E_REAL_NODE:-true}" != true ]] || tl::ctrd::ensure_packages
exec "${TL_PY}" -m pytest -m cluster tests/e2e "$@"
