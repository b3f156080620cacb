#!/usr/bin/env bash
# Run the e2e tests (tests/e2e, marker "cluster"): their session fixture starts a local cluster
# with hack/cluster-up.sh (four kwok GPU nodes, the real kube-scheduler and the extender) and
# stops it at the end.
#
# usage: hack/e2e-test.sh [pytest args...]
#   BUILD=false   do not build missing binaries first (the tests then fail, saying which)
set -o errexit -o nounset -o pipefail

source "$(dirname "${BASH_SOURCE[0]}")/lib/python.sh"

BUILD="${BUILD:-true}"

usage() { sed -n '2,8p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then usage; exit 0; fi

cd "${TL_ROOT}"
tl::py::ensure
if [[ "${BUILD}" == true ]]; then
  "${TL_HACK}/build-binaries.sh" etcd kube-apiserver kubectl kube-scheduler kube-controller-manager kwok
fi
exec "${TL_PY}" -m pytest -m cluster tests/e2e "$@"
