#!/usr/bin/env bash
# Run Kueue's controller manager on a running local cluster (hack/cluster-up.sh) until SIGTERM or
# SIGINT or until its parent process exits; then stop it and remove its webhook configurations
# (its CRDs stay). Used by tests/e2e/test_kueue.py; see hack/lib/kueue.sh for how it is set up.
#
# usage: hack/kueue-up.sh KUBECONFIG DIR
#   Builds the kueue binary first if it is missing (hack/build-binaries.sh kueue). Files and
#   logs go to DIR; when ready it writes DIR/kueue.env (KUEUE_PID, KUEUE_LOG, KUEUE_HEALTH_URL).
set -o errexit -o nounset -o pipefail

source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
source "${TL_HACK}/lib/python.sh"
source "${TL_HACK}/lib/kueue.sh"

usage() { sed -n '2,9p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }
[[ $# -eq 2 && "$1" != -h && "$1" != --help ]] || { usage >&2; exit 2; }
kubeconfig="$1" dir="$2"
state="${dir}/kueue.env"

cleanup() {
  local rc=$?
  trap - EXIT
  trap '' INT TERM HUP
  rm -f "${state}"
  tl::kueue::stop
  exit "${rc}"
}
trap cleanup EXIT
trap 'exit 0' INT TERM HUP

tl::require_cmd curl openssl go
"${TL_HACK}/build-binaries.sh" kueue
tl::py::ensure
tl::kueue::start "${dir}" "${kubeconfig}"
printf 'KUEUE_PID=%s\nKUEUE_LOG=%s\nKUEUE_HEALTH_URL=%s\n' "${TL_KUEUE_PID}" \
  "${dir}/kueue.log" "${TL_KUEUE_HEALTH_URL}" >"${state}.tmp"
mv "${state}.tmp" "${state}"
tl::supervise "${TL_KUEUE_PARENT_PID:-${PPID}}" "Kueue" tl::kueue::alive
