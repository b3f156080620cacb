#!/usr/bin/env bash
# Smoke check of the cached binaries: start etcd and kube-apiserver on loopback, wait for
# /readyz, list namespaces with kubectl, stop everything and clean up.
set -o errexit -o nounset -o pipefail

source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
source "${TL_HACK}/lib/controlplane.sh"

# Build missing binaries first (true) or fail when they are missing (false).
BUILD="${BUILD:-true}"

usage() {
  cat <<EOF
Usage: $(basename "$0") [-h]

Starts etcd ${ETCD_VERSION} and kube-apiserver ${KUBE_VERSION} from $(tl::cache_dir)/bin on
loopback, checks 'kubectl get ns', then stops them.

Environment: BUILD (${BUILD}: run hack/build-binaries.sh for missing binaries first),
TL_CP_KEEP_DIR (keep logs/data), TL_CP_ADVERTISE_ADDRESS, TL_CP_APISERVER_EXTRA_ARGS,
TL_CP_READY_TIMEOUT (see hack/lib/controlplane.sh).
EOF
}

cleanup() {
  local rc=$?
  tl::cp::stop
  exit "${rc}"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM HUP

main() {
  local opt kubectl start
  while getopts ":h" opt; do
    case "${opt}" in
      h) usage; exit 0 ;;
      *) usage >&2; exit 2 ;;
    esac
  done
  shift $((OPTIND - 1))
  [[ $# -eq 0 ]] || { usage >&2; exit 2; }

  tl::require_cmd curl openssl
  if [[ "${BUILD}" == true ]]; then
    "${TL_HACK}/build-binaries.sh" etcd kube-apiserver kubectl
  fi
  kubectl="$(tl::bin kubectl)"

  start="$(tl::now_s)"
  tl::cp::start_etcd
  tl::cp::start_apiserver
  tl::cp::wait_ready

  tl::log "kubectl get ns"
  "${kubectl}" --server "${TL_CP_SERVER}" --token "${TL_CP_TOKEN}" --insecure-skip-tls-verify \
    get ns >&2
  # The kubeconfig verifies the serving certificate instead of skipping verification.
  "${kubectl}" --kubeconfig "${TL_CP_KUBECONFIG}" get --raw /version >&2
  printf '\n' >&2
  tl::log "smoke check passed in $(tl::elapsed "${start}")s"
}

main "$@"
