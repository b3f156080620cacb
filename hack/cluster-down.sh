#!/usr/bin/env bash
# Stop a cluster started by hack/cluster-up.sh and remove its directory. Idempotent: nothing
# running is not an error.
#
# usage: hack/cluster-down.sh [-D DIR]
#   -D  cluster directory (TL_CLUSTER_DIR, default ${TMPDIR:-/tmp}/tidelease-cluster-$UID)
#
# Asks the cluster's supervisor to stop (it stops every component, dependents first), then stops
# by pid whatever that cluster recorded and still runs (a supervisor killed with SIGKILL leaves
# its components behind). TL_CLUSTER_KEEP_DIR=true keeps the directory (logs, data).
set -o errexit -o nounset -o pipefail

source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
source "${TL_HACK}/lib/cluster.sh"

# Seconds to wait for the supervisor to stop everything before stopping pids directly.
TL_CLUSTER_DOWN_TIMEOUT="${TL_CLUSTER_DOWN_TIMEOUT:-90}"

usage() { sed -n '2,10p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }

main() {
  local opt pid deadline start
  while getopts ":D:h" opt; do
    case "${opt}" in
      D) TL_CLUSTER_DIR="${OPTARG}" ;;
      h) usage; exit 0 ;;
      *) usage >&2; exit 2 ;;
    esac
  done
  shift $((OPTIND - 1))
  [[ $# -eq 0 ]] || { usage >&2; exit 2; }
  TL_CLUSTER_DIR="$(realpath -m -- "${TL_CLUSTER_DIR}")"

  if [[ ! -e "${TL_CLUSTER_DIR}" ]]; then
    tl::log "no cluster in ${TL_CLUSTER_DIR}; nothing to do"
    return 0
  fi
  [[ -f "${TL_CLUSTER_DIR}/${TL_CLUSTER_MARKER}" ]] ||
    tl::die "${TL_CLUSTER_DIR} is not a tidelease cluster directory"
  start="$(tl::now_s)"
  # The cluster's pids (recorded as each process started, so a cluster still starting is
  # covered too), copied outside DIR: the supervisor removes them, and DIR, as it stops.
  local saved
  saved="$(mktemp "${TMPDIR:-/tmp}/tidelease-cluster-down.XXXXXX")"
  cp "$(tl::cluster::pids_file)" "${saved}" 2>/dev/null || true
  pid="$(tl::cluster::read_state "${saved}" TL_CLUSTER_SUPERVISOR_PID)"
  if [[ -n "${pid}" ]] && tl::cluster::alive "${pid}" cluster-up.sh; then
    tl::log "stopping the cluster's supervisor (pid ${pid})"
    kill -TERM "${pid}" 2>/dev/null || true
    deadline=$((SECONDS + TL_CLUSTER_DOWN_TIMEOUT))
    while tl::cluster::alive "${pid}" cluster-up.sh && ((SECONDS < deadline)); do sleep 0.2; done
    if tl::cluster::alive "${pid}" cluster-up.sh; then
      tl::warn "supervisor ${pid} still runs; stopping components by pid"
    fi
  fi
  # Whatever that cluster recorded and still runs (a supervisor killed with SIGKILL).
  tl::cluster::kill_recorded "${saved}" "${TL_CLUSTER_DIR}"
  rm -f "${saved}"
  if [[ ! -e "${TL_CLUSTER_DIR}" ]]; then
    tl::log "cluster in ${TL_CLUSTER_DIR} is down ($(tl::elapsed "${start}")s)"
    return 0
  fi
  if [[ "${TL_CLUSTER_KEEP_DIR}" == true ]]; then
    rm -f "$(tl::cluster::state_file)" "$(tl::cluster::pids_file)"
    tl::log "keeping ${TL_CLUSTER_DIR}"
  else
    tl::cluster::remove_dir "${TL_CLUSTER_DIR}"
  fi
  tl::log "cluster in ${TL_CLUSTER_DIR} is down ($(tl::elapsed "${start}")s)"
}

main "$@"
