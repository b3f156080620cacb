#!/usr/bin/env bash
# Start a local cluster on loopback: etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler (the chart's scheduler configuration, pointed at the local extender), kwok with
# TL_CLUSTER_NODES fake GPU nodes (nvidia.com/gpu: 8, a GpuNode object each), tidelease's CRDs
# and PriorityClasses, and the tidelease extender. Ports are free loopback ports.
#
# usage: hack/cluster-up.sh [-f | -d] [-n NODES] [-D DIR] [-p] [-r] [-R]
#   -f  foreground (default): run until SIGINT/SIGTERM (or until TL_CLUSTER_PARENT_PID exits),
#       then stop everything and clean up
#   -d  detach: start in the background, return once ready; stop with hack/cluster-down.sh
#   -n  kwok GPU nodes to create (TL_CLUSTER_NODES, default 4)
#   -D  cluster directory (TL_CLUSTER_DIR, default ${TMPDIR:-/tmp}/tidelease-cluster-$UID): a
#       new or empty one is used; one left by a cluster that died is cleaned up first; any other
#       is refused. It is removed when the cluster stops (TL_CLUSTER_KEEP_DIR=true keeps it).
#   -p  also run a kube-scheduler without extenders for pods with schedulerName tidelease-plain
#   -r  also join a real node (hack/realnode.sh: containerd + kubelet + the tidelease agent with
#       fake GPUs; needs root): TL_CLUSTER_REAL_NODE=true
#   -R  also join a real node in DRA mode (hack/realnode.sh -d: containerd 2.x with CDI, the
#       agent's ResourceSlice and kubelet DRA plugin; needs root): TL_CLUSTER_REAL_DRA_NODE=true
#
# When ready it writes DIR/cluster.env (KUBECONFIG, TL_CLUSTER_SERVER, TL_CLUSTER_TOKEN,
# TL_CLUSTER_CA, TL_CLUSTER_EXTENDER_URL, the pids, ...; `source` it). Idempotent: with -d, a
# cluster already running in DIR is reported and left alone; a stale DIR (its supervisor gone)
# is cleaned up first. Other settings: see hack/lib/cluster.sh (TL_CLUSTER_*); variables
# TIDELEASE_EXTENDER_* reach the extender. The extender runs the leasing controller, the
# hot-restart operator and the prewarm controller (not the planner, nor the orchestrator), and
# gives borrowers TL_CLUSTER_LEASING_GRACE_S (2) seconds of notice. It runs from the project's
# virtualenv, TL_VENV (default: .venv in the checkout), created and installed on first use.
set -o errexit -o nounset -o pipefail

source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
source "${TL_HACK}/lib/cluster.sh"

MODE="${TL_CLUSTER_MODE:-foreground}"
# Foreground mode also exits when this process does (the test fixture's pytest).
TL_CLUSTER_PARENT_PID="${TL_CLUSTER_PARENT_PID:-}"

usage() { sed -n '2,28p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }

cleanup() {
  local rc=$?
  # Stopping takes seconds; a second signal must not cut it short.
  trap - EXIT
  trap '' INT TERM HUP
  tl::cluster::stop
  exit "${rc}"
}

# Report (once) a component that dies; the cluster keeps running for what is left of it.
DIED=""
report_died() {
  local now_died
  if [[ -z "${DIED}" ]] && now_died="$(tl::cluster::component_died)"; then
    DIED="${now_died}"
    tl::warn "${DIED} exited; see ${TL_CLUSTER_DIR}/logs"
  fi
}

# Wait for a signal or the parent's exit, without a busy loop.
supervise() {
  tl::supervise "${TL_CLUSTER_PARENT_PID}" "the cluster" report_died
}

run_foreground() {
  if [[ "${TL_CLUSTER_DETACHED_CHILD:-}" != 1 ]]; then
    tl::cluster::reap_stale "${TL_CLUSTER_DIR}" ||
      tl::die "a cluster already runs in ${TL_CLUSTER_DIR} (hack/cluster-down.sh -D ${TL_CLUSTER_DIR})"
  fi
  trap cleanup EXIT
  trap 'exit 0' INT TERM HUP
  tl::cluster::start
  supervise
}

# wait_ready PID LOG - until the state file appears (ready), or PID (the supervisor) exits.
wait_ready() {
  local pid="$1" log="$2" state deadline
  state="$(tl::cluster::state_file)"
  deadline=$((SECONDS + TL_CLUSTER_READY_TIMEOUT + TL_CP_READY_TIMEOUT))
  until [[ -f "${state}" ]]; do
    if ! kill -0 "${pid}" 2>/dev/null; then
      tail -n 40 "${log}" >&2 || true
      tl::die "the cluster did not start (log above)"
    fi
    if ((SECONDS >= deadline)); then
      kill -TERM "${pid}" 2>/dev/null || true
      tl::die "the cluster was not ready in time; see ${log}"
    fi
    sleep 0.2
  done
  tl::log "cluster running in the background (supervisor pid ${pid}); state in ${state}"
  tl::log "stop it with: hack/cluster-down.sh -D ${TL_CLUSTER_DIR}"
  cat "${state}"
}

run_detached() {
  local log="${TL_CLUSTER_DIR}/logs/cluster-up.log" pid
  if tl::cluster::running "${TL_CLUSTER_DIR}"; then
    tl::log "a cluster already runs in ${TL_CLUSTER_DIR}"
    wait_ready "$(tl::cluster::read_state "$(tl::cluster::pids_file)" TL_CLUSTER_SUPERVISOR_PID)" "${log}"
    return 0
  fi
  tl::cluster::reap_stale "${TL_CLUSTER_DIR}"
  tl::cluster::init_dir
  TL_CLUSTER_DETACHED_CHILD=1 TL_CLUSTER_MODE=foreground TL_CLUSTER_PARENT_PID="" \
    setsid "${BASH_SOURCE[0]}" </dev/null >"${log}" 2>&1 &
  pid=$!
  tl::cluster::record_pid TL_CLUSTER_SUPERVISOR_PID "${pid}"
  wait_ready "${pid}" "${log}"
}

main() {
  local opt
  while getopts ":fdn:D:prRh" opt; do
    case "${opt}" in
      f) MODE=foreground ;;
      d) MODE=detach ;;
      n) TL_CLUSTER_NODES="${OPTARG}" ;;
      D) TL_CLUSTER_DIR="${OPTARG}" ;;
      p) TL_CLUSTER_PLAIN_SCHEDULER=true ;;
      r) TL_CLUSTER_REAL_NODE=true ;;
      R) TL_CLUSTER_REAL_DRA_NODE=true ;;
      h) usage; exit 0 ;;
      *) usage >&2; exit 2 ;;
    esac
  done
  shift $((OPTIND - 1))
  [[ $# -eq 0 ]] || { usage >&2; exit 2; }
  TL_CLUSTER_DIR="$(realpath -m -- "${TL_CLUSTER_DIR}")"
  export TL_CLUSTER_NODES TL_CLUSTER_DIR TL_CLUSTER_PLAIN_SCHEDULER TL_CLUSTER_REAL_NODE \
    TL_CLUSTER_REAL_DRA_NODE

  tl::require_cmd curl openssl python3 setsid
  tl::cluster::check_settings
  tl::cluster::require_binaries
  tl::py::ensure >&2

  case "${MODE}" in
    foreground) run_foreground ;;
    detach) run_detached ;;
    *) tl::die "unknown mode ${MODE}" ;;
  esac
}

main "$@"
