#!/usr/bin/env bash
# Run a throw-away API server (etcd + kube-apiserver on loopback) with tidelease's CRDs, until
# SIGTERM or SIGINT or until its parent process exits; then stop everything and remove its
# directory. Used by tests/apiserver.
#
# usage: hack/apiserver.sh STATE_FILE
#   When ready, writes KEY=VALUE lines to STATE_FILE: KUBECONFIG, SERVER, TOKEN, CA, DIR.
set -o errexit -o nounset -o pipefail

source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
source "${TL_HACK}/lib/controlplane.sh"

usage() { sed -n '2,7p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }
[[ $# -eq 1 && "$1" != -h && "$1" != --help ]] || { usage >&2; exit 2; }
state_file="$1"

cleanup() {
  local rc=$?
  rm -f "${state_file}"
  tl::cp::stop
  exit "${rc}"
}
trap cleanup EXIT
trap 'exit 0' INT TERM HUP

tl::require_cmd curl openssl
kubectl="$(tl::bin kubectl)"
start="$(tl::now_s)"
tl::cp::start_etcd
tl::cp::start_apiserver
tl::cp::wait_ready
"${kubectl}" --kubeconfig "${TL_CP_KUBECONFIG}" apply -f "${TL_CHART}/crds" >&2
"${kubectl}" --kubeconfig "${TL_CP_KUBECONFIG}" wait --for condition=established \
  --timeout=60s crd/gpunodes.tidelease.io crd/gpuallocations.tidelease.io \
  crd/gpuleases.tidelease.io >&2
{
  printf 'KUBECONFIG=%s\nSERVER=%s\nTOKEN=%s\nCA=%s\nDIR=%s\n' "${TL_CP_KUBECONFIG}" \
    "${TL_CP_SERVER}" "${TL_CP_TOKEN}" "${TL_CP_CA}" "${TL_CP_DIR}"
} >"${state_file}.tmp"
mv "${state_file}.tmp" "${state_file}"
tl::log "API server ready with CRDs in $(tl::elapsed "${start}") s"
# Until a signal, or until the parent (TL_APISERVER_PARENT_PID, else the process that started
# this script) is gone: a test run killed outright leaves nothing running.
tl::supervise "${TL_APISERVER_PARENT_PID:-${PPID}}" "the API server"
