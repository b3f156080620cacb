# shellcheck shell=bash
# A whole local cluster on loopback, from the binaries hack/build-binaries.sh caches: etcd and
# kube-apiserver (controlplane.sh), kube-controller-manager, kube-scheduler with tidelease's
# KubeSchedulerConfiguration, kwok managing fake GPU nodes (each with a GpuNode object), and the
# tidelease extender. Used by hack/cluster-up.sh and hack/cluster-down.sh; source it after
# common.sh.
#
# Everything lives in TL_CLUSTER_DIR: the control plane's data and certificates, the rewritten
# configurations, one log per component under logs/, pids.env (each process's pid, recorded as
# it starts, for cluster-down) and, once everything is ready, the state file cluster.env
# (KEY=VALUE lines, see tl::cluster::write_state) that tells the tests where things are.
#
# Loopback only: every port is a free 127.0.0.1 port; the kube-schedulers serve /metrics without
# credentials (for hack/bench-scale.py). The control plane's own components and the tests use one
# cluster-admin token; tidelease's components run as the chart's ServiceAccounts, with the chart's
# RBAC and identity-keyed admission policies applied (tl::cluster::apply_grants): every test runs
# on the grants an admin installs, so a grant the chart lacks fails a test.
#
#   tl::cluster::start   start everything and wait until it is ready (sets TL_CLUSTER_* below)
#   tl::cluster::stop    stop everything started by this shell, in reverse order (idempotent)

if [[ -n "${TL_CLUSTER_SOURCED:-}" ]]; then
  return 0
fi
TL_CLUSTER_SOURCED=1

# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
# shellcheck source=controlplane.sh
source "${TL_HACK}/lib/controlplane.sh"
# shellcheck source=python.sh
source "${TL_HACK}/lib/python.sh"
# shellcheck source=containerd.sh
source "${TL_HACK}/lib/containerd.sh"

# Settings (override from the environment).
TL_CLUSTER_DIR="${TL_CLUSTER_DIR:-${TMPDIR:-/tmp}/tidelease-cluster-${UID}}"
# Number of kwok GPU nodes created at start, named ${TL_CLUSTER_NODE_PREFIX}-<i>.
TL_CLUSTER_NODES="${TL_CLUSTER_NODES:-4}"
TL_CLUSTER_NODE_PREFIX="${TL_CLUSTER_NODE_PREFIX:-kwok-gpu}"
# The release namespace tidelease's components run in (their ServiceAccounts, heartbeats, leader
# elections): the chart's as tl::chart::render renders it.
TL_CLUSTER_NAMESPACE=tidelease-system
TL_CLUSTER_GPUS_PER_NODE="${TL_CLUSTER_GPUS_PER_NODE:-8}"
# An NVML fake layout (nvswitch-8, pcie-2socket-8, nvlink-pairs-4) whose topology every kwok
# node's GpuNode publishes (hack/cluster-nodes.py --topology); empty: none.
TL_CLUSTER_NODE_TOPOLOGY="${TL_CLUSTER_NODE_TOPOLOGY:-}"
TL_CLUSTER_GPU_TYPE="${TL_CLUSTER_GPU_TYPE:-H20}"
# true: also run a second kube-scheduler, without extenders, for pods with this schedulerName
# (hack/bench-scale.py compares the two).
TL_CLUSTER_PLAIN_SCHEDULER="${TL_CLUSTER_PLAIN_SCHEDULER:-false}"
TL_CLUSTER_CONTROLLER_FLAGS="${TL_CLUSTER_CONTROLLER_FLAGS:---leasing-controller --hot-restart-operator --prewarm-controller --gang-controller}"
TL_CLUSTER_PLAIN_SCHEDULER_NAME="${TL_CLUSTER_PLAIN_SCHEDULER_NAME:-tidelease-plain}"
# kube-scheduler's client QPS/burst; empty keeps the configuration's (i.e. upstream's 50/100).
TL_CLUSTER_SCHEDULER_QPS="${TL_CLUSTER_SCHEDULER_QPS:-}"
TL_CLUSTER_SCHEDULER_BURST="${TL_CLUSTER_SCHEDULER_BURST:-}"
# kwok node lease duration (it renews every quarter of it) and the controller manager's grace
# period before it marks a silent node NotReady; raise both for large node counts.
TL_CLUSTER_NODE_LEASE_S="${TL_CLUSTER_NODE_LEASE_S:-40}"
TL_CLUSTER_NODE_GRACE="${TL_CLUSTER_NODE_GRACE:-50s}"
# kube-controller-manager's client QPS/burst. Its default (20/30) lifts the not-ready taint of
# new nodes at about 5 nodes/s: minutes for a thousand kwok nodes.
TL_CLUSTER_KCM_QPS="${TL_CLUSTER_KCM_QPS:-200}"
TL_CLUSTER_KCM_BURST="${TL_CLUSTER_KCM_BURST:-400}"
TL_CLUSTER_READY_TIMEOUT="${TL_CLUSTER_READY_TIMEOUT:-180}"
TL_CLUSTER_VERBOSITY="${TL_CLUSTER_VERBOSITY:-1}"
# kube-scheduler's alone (2: each pod it cannot place, with every node's reason, the
# extender's included; the e2e tests ask for it, to read a stuck pod's story after a failure).
TL_CLUSTER_SCHEDULER_VERBOSITY="${TL_CLUSTER_SCHEDULER_VERBOSITY:-${TL_CLUSTER_VERBOSITY}}"
TL_CLUSTER_EXTENDER_LOG_LEVEL="${TL_CLUSTER_EXTENDER_LOG_LEVEL:-INFO}"
# Seconds of notice every reclaim gives borrowers on this cluster, whatever its lease's
# graceSeconds (the CRD keeps those at 30 or more): the extender's leasing_test_grace_s, so that
# tests do not wait half a minute per reclaim. Empty: the leases' own notice, as in production.
TL_CLUSTER_LEASING_GRACE_S="${TL_CLUSTER_LEASING_GRACE_S-2}"
# true: the controllers' leasing in DRA mode (the setting dra, docs/dra.md#reclaim-in-dra-mode):
# it also reads ResourceClaims and pins returning replicas' claims. Pods without claims are
# leased as in extender mode either way.
TL_CLUSTER_LEASING_DRA="${TL_CLUSTER_LEASING_DRA:-false}"
# true: also join a real node (hack/realnode.sh: Debian's containerd and a real kubelet, root
# only) named TL_CLUSTER_REAL_NODE_NAME, with TL_CLUSTER_REAL_NODE_GPUS fake GPUs served by the
# tidelease agent's device plugin. It is tainted tidelease.io/real-node=true:NoSchedule.
TL_CLUSTER_REAL_NODE="${TL_CLUSTER_REAL_NODE:-false}"
TL_CLUSTER_REAL_NODE_NAME="${TL_CLUSTER_REAL_NODE_NAME:-real-0}"
TL_CLUSTER_REAL_NODE_GPUS="${TL_CLUSTER_REAL_NODE_GPUS:-8}"
# A size in MiB: the real node's agent keeps a peer cache on a tmpfs of that size of the node's
# own (hack/realnode.sh -C; the soak fills it). Empty: no cache.
TL_CLUSTER_REAL_NODE_CACHE_MIB="${TL_CLUSTER_REAL_NODE_CACHE_MIB:-}"
# A fake layout of the real node's GPUs (hack/realnode.sh -T: nvswitch-8, pcie-2socket-8,
# nvlink-pairs-4), published as its GpuNode's status.topology. Empty: no topology.
TL_CLUSTER_REAL_NODE_TOPOLOGY="${TL_CLUSTER_REAL_NODE_TOPOLOGY:-}"
# true: also join a second real node in DRA mode (hack/realnode.sh -d: containerd 2.x, built by
# hack/build-binaries.sh, with CDI; the agent publishes a ResourceSlice and serves the kubelet's
# DRA plugin, no device plugin), named TL_CLUSTER_REAL_DRA_NODE_NAME, with one fake GPU per tier
# of TL_CLUSTER_REAL_DRA_NODE_TIERS (by index). Same taint and client CA as the first.
TL_CLUSTER_REAL_DRA_NODE="${TL_CLUSTER_REAL_DRA_NODE:-false}"
TL_CLUSTER_REAL_DRA_NODE_NAME="${TL_CLUSTER_REAL_DRA_NODE_NAME:-real-dra-0}"
TL_CLUSTER_REAL_DRA_NODE_TIERS="${TL_CLUSTER_REAL_DRA_NODE_TIERS:-MA,HA,LA,MA}"
# true: leave TL_CLUSTER_DIR (logs, data) behind when the cluster stops.
TL_CLUSTER_KEEP_DIR="${TL_CLUSTER_KEEP_DIR:-false}"

TL_CLUSTER_STATE_NAME="cluster.env"
# KEY=PID lines, appended as each process starts (the state file comes only once all is ready),
# so that a cluster can be stopped at any moment, half-started ones included.
TL_CLUSTER_PIDS_NAME="pids.env"
# A file that marks a directory as a tidelease cluster's (so stale ones may be removed).
TL_CLUSTER_MARKER=".tidelease-cluster"

# Process ids of what this shell started (besides controlplane.sh's etcd and apiserver).
TL_CLUSTER_KCM_PID=""
TL_CLUSTER_KWOK_PID=""
TL_CLUSTER_EXTENDER_PID=""
TL_CLUSTER_CONTROLLERS_PID=""
TL_CLUSTER_CONTROLLERS_URL=""
TL_CLUSTER_EXTENDER_URL=""
TL_CLUSTER_EXTENDER_PROBE_URL=""
TL_CLUSTER_EXTENDER_CERTS=""
TL_CLUSTER_SCHEDULER_PID=""
TL_CLUSTER_PLAIN_SCHEDULER_PID=""
TL_CLUSTER_REAL_NODE_PID=""
TL_CLUSTER_REAL_NODE_IP=""
TL_CLUSTER_REAL_NODE_CTRD_SOCK=""
TL_CLUSTER_REAL_NODE_GATEWAY=""
TL_CLUSTER_REAL_DRA_NODE_PID=""
TL_CLUSTER_REAL_DRA_NODE_IP=""
TL_CLUSTER_REAL_DRA_NODE_CTRD_SOCK=""
TL_CLUSTER_REAL_DRA_NODE_CDI_DIR=""
TL_CLUSTER_REAL_DRA_NODE_GATEWAY=""
TL_CLUSTER_REAL_DRA_NODE_GPUS=""

tl::cluster::state_file() {
  printf '%s/%s\n' "${1:-${TL_CLUSTER_DIR}}" "${TL_CLUSTER_STATE_NAME}"
}

tl::cluster::pids_file() {
  printf '%s/%s\n' "${1:-${TL_CLUSTER_DIR}}" "${TL_CLUSTER_PIDS_NAME}"
}

# tl::cluster::record_pid KEY PID - note a process of this cluster as soon as it starts.
tl::cluster::record_pid() {
  printf '%s=%s\n' "$1" "$2" >>"$(tl::cluster::pids_file)"
}

# tl::cluster::check_settings - fail early on settings that cannot work.
tl::cluster::check_settings() {
  [[ "${TL_CLUSTER_NODES}" =~ ^[0-9]+$ ]] || tl::die "TL_CLUSTER_NODES must be a number"
  [[ "${TL_CLUSTER_GPUS_PER_NODE}" =~ ^[0-9]+$ ]] || tl::die "TL_CLUSTER_GPUS_PER_NODE must be a number"
  [[ "${TL_CLUSTER_NODE_LEASE_S}" =~ ^[1-9][0-9]*$ ]] || tl::die "TL_CLUSTER_NODE_LEASE_S must be a positive number"
  [[ "${TL_CLUSTER_REAL_NODE}" =~ ^(true|false)$ ]] || tl::die "TL_CLUSTER_REAL_NODE must be true or false"
  [[ "${TL_CLUSTER_LEASING_DRA}" =~ ^(true|false)$ ]] || tl::die "TL_CLUSTER_LEASING_DRA must be true or false"
  [[ "${TL_CLUSTER_REAL_NODE_GPUS}" =~ ^[0-9]+$ ]] || tl::die "TL_CLUSTER_REAL_NODE_GPUS must be a number"
  if [[ "${TL_CLUSTER_REAL_NODE}" == true && "${EUID}" -ne 0 ]]; then
    tl::die "a real node (-r) needs root: containerd, cgroups and mounts"
  fi
  [[ "${TL_CLUSTER_REAL_DRA_NODE}" =~ ^(true|false)$ ]] ||
    tl::die "TL_CLUSTER_REAL_DRA_NODE must be true or false"
  [[ "${TL_CLUSTER_REAL_DRA_NODE_TIERS}" =~ ^(HA|MA|LA)(,(HA|MA|LA))*$ ]] ||
    tl::die "TL_CLUSTER_REAL_DRA_NODE_TIERS must be HA, MA or LA per GPU, comma-separated"
  if [[ "${TL_CLUSTER_REAL_DRA_NODE}" == true && "${EUID}" -ne 0 ]]; then
    tl::die "a real DRA node needs root: containerd, cgroups and mounts"
  fi
  if [[ "${TL_CLUSTER_REAL_DRA_NODE}" == true &&
    "${TL_CLUSTER_REAL_DRA_NODE_NAME}" == "${TL_CLUSTER_REAL_NODE_NAME}" ]]; then
    tl::die "the two real nodes need different names"
  fi
  [[ "${TL_CLUSTER_DIR}" == /* ]] || tl::die "TL_CLUSTER_DIR must be an absolute path"
  [[ "${TL_CLUSTER_DIR}" =~ ^[A-Za-z0-9_./-]+$ ]] ||
    tl::die "TL_CLUSTER_DIR may only hold letters, digits and _ . / - (it goes into a state file)"
}

# tl::cluster::require_binaries - every binary the cluster needs, with one clear hint if not.
tl::cluster::require_binaries() {
  local name missing=()
  local -a names=(etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kwok)
  [[ "${TL_CLUSTER_REAL_NODE}" != true && "${TL_CLUSTER_REAL_DRA_NODE}" != true ]] ||
    names+=(kubelet)
  for name in "${names[@]}"; do
    [[ -x "$(tl::bin_path "${name}")" ]] || missing+=("${name}")
  done
  if [[ "${TL_CLUSTER_REAL_DRA_NODE}" == true ]]; then
    for name in "${TL_CTRD2_COMPONENTS[@]}"; do
      [[ -x "$(tl::ctrd::bin2_path "${name}")" ]] || missing+=("${name}")
    done
  fi
  if ((${#missing[@]} > 0)); then
    tl::die "missing binaries: ${missing[*]} (under $(tl::cache_dir)/bin); run hack/build-binaries.sh"
  fi
}

# tl::cluster::alive PID [TEXT] - PID runs, and (with TEXT) its command line contains TEXT (the
# cluster directory, say), so a recycled pid is never taken for one of ours.
tl::cluster::alive() {
  local pid="$1" text="${2:-}"
  tl::cp::_alive "${pid}" || return 1
  [[ -z "${text}" ]] && return 0
  tr '\0' ' ' <"/proc/${pid}/cmdline" 2>/dev/null | grep -qF -- "${text}"
}

# tl::cluster::read_state FILE KEY - one value of a state file (empty if absent).
tl::cluster::read_state() {
  [[ -f "$1" ]] || return 0
  sed -n "s/^$2=//p" "$1" | tail -n 1
}

# tl::cluster::running DIR - whether DIR holds a cluster (ready or starting) whose supervisor is
# alive.
tl::cluster::running() {
  local pid
  pid="$(tl::cluster::read_state "$(tl::cluster::pids_file "$1")" TL_CLUSTER_SUPERVISOR_PID)"
  [[ -n "${pid}" ]] && tl::cluster::alive "${pid}" cluster-up.sh
}

# tl::cluster::kill_recorded PIDS_FILE DIR - stop, by pid, whatever a cluster recorded and still
# runs (a supervisor killed with SIGKILL leaves its components behind): last started first, so
# the control plane goes last. Only processes whose command line names DIR are touched.
tl::cluster::kill_recorded() {
  local pids="$1" dir="$2" key pid deadline
  [[ -f "${pids}" ]] || return 0
  while IFS='=' read -r key pid; do
    [[ "${key}" != TL_CLUSTER_SUPERVISOR_PID && -n "${pid}" ]] || continue
    if tl::cluster::alive "${pid}" "${dir}"; then
      tl::log "stopping leftover ${key} (pid ${pid})"
      kill -TERM "${pid}" 2>/dev/null || true
      deadline=$((SECONDS + TL_CP_STOP_TIMEOUT))
      while tl::cluster::alive "${pid}" "${dir}" && ((SECONDS < deadline)); do sleep 0.2; done
      if tl::cluster::alive "${pid}" "${dir}"; then kill -KILL "${pid}" 2>/dev/null || true; fi
    fi
  done < <(tac "${pids}")
}

# tl::cluster::remove_dir DIR - remove a cluster directory, only if it is marked as one.
tl::cluster::remove_dir() {
  local dir="$1"
  [[ -d "${dir}" ]] || return 0
  if [[ -f "${dir}/${TL_CLUSTER_MARKER}" ]]; then
    rm -rf -- "${dir}"
  else
    tl::die "${dir} exists and is not a tidelease cluster directory; refusing to remove it"
  fi
}

# tl::cluster::reap_stale DIR - a cluster directory left by a run that did not clean up: stop
# what it recorded and remove it. A live cluster is left alone (returns 1); an empty directory
# is kept, to be used.
tl::cluster::reap_stale() {
  local dir="$1"
  [[ -e "${dir}" ]] || return 0
  # An empty directory (made for the cluster, say with mktemp -d) is used as it is.
  if [[ -d "${dir}" && -z "$(ls -A -- "${dir}")" ]]; then
    return 0
  fi
  if tl::cluster::running "${dir}"; then
    return 1
  fi
  tl::log "removing stale cluster directory ${dir}"
  tl::cluster::kill_recorded "$(tl::cluster::pids_file "${dir}")" "${dir}"
  tl::cluster::remove_dir "${dir}"
}

# tl::cluster::init_dir - create TL_CLUSTER_DIR (marked) with its logs/ folder.
tl::cluster::init_dir() {
  mkdir -p "${TL_CLUSTER_DIR}/logs"
  touch "${TL_CLUSTER_DIR}/${TL_CLUSTER_MARKER}"
  TL_CP_DIR="${TL_CLUSTER_DIR}"
  export TL_CP_DIR TL_CLUSTER_DIR
}

tl::cluster::_kubectl() {
  "$(tl::bin kubectl)" --kubeconfig "${TL_CP_KUBECONFIG}" "$@"
}

# tl::cluster::_wait_http NAME PID URL LOG [TIMEOUT] - wait for URL to answer 2xx; fail early with
# the log's tail if the process exits.
tl::cluster::_wait_http() {
  local name="$1" pid="$2" url="$3" log="$4" timeout="${5:-${TL_CLUSTER_READY_TIMEOUT}}" deadline
  deadline=$((SECONDS + timeout))
  until curl -ksf --max-time 2 "${url}" >/dev/null 2>&1; do
    tl::cp::_alive "${pid}" || tl::cp::_fail "${name}" "${log}"
    ((SECONDS < deadline)) || tl::cp::_fail "${name} (${url} not ready after ${timeout}s)" "${log}"
    sleep 0.2
  done
}

# tl::cluster::apply_manifests - the chart's CRDs (waited for) and PriorityClasses, and the
# tidelease-system namespace (agents' heartbeats, the controllers' leader election).
tl::cluster::apply_manifests() {
  local log="${TL_CLUSTER_DIR}/logs/apply.log"
  {
    tl::cluster::_kubectl apply -f "${TL_CHART}/crds" &&
      tl::chart::render --show-only templates/priorityclasses.yaml |
      tl::cluster::_kubectl apply -f - &&
      tl::cluster::_kubectl create namespace "${TL_CLUSTER_NAMESPACE}" --dry-run=client -o yaml |
      tl::cluster::_kubectl apply -f - &&
      tl::cluster::_kubectl wait --for condition=established --timeout=60s crd --all
  } >"${log}" 2>&1 || tl::cp::_fail "applying the chart's CRDs and PriorityClasses" "${log}"
}

# tl::cluster::apply_grants - the chart's ServiceAccounts, their RBAC and the admission policies
# keyed on their identities (agent-policy, controllers-policy, leases-policy), rendered as
# `helm install` makes them for this cluster (clusterScheduler mode, DRA on, the optional
# controllers the tests start on, every namespace a lease and orchestrator namespace, the test
# group workload of tests/e2e/groupworkload.py a kind leases may scale) and applied
# alone, the cluster-wide ones named with the suffix -local and all labelled instance "local"
# (a release of the chart in the same cluster, as tests/e2e/test_helm_install.py installs in a
# namespace of its own, keeps its names and finds only its own objects);
# then a kubeconfig per account with its token (tl::cluster::account_kubeconfig). The
# extender, the controllers, the real nodes' agents (tokens bound to their node) and the
# components tests start (queues controller, orchestrator) run with them. The tenant-facing
# policies are left to the tests that check them (tests/e2e/test_tenancy.py: on and off).
tl::cluster::apply_grants() {
  local log="${TL_CLUSTER_DIR}/logs/grants.log" template account
  local -a shown=()
  for template in agent-rbac agent-policy controllers controllers-policy leases-policy \
    extender-rbac orchestrator; do
    shown+=(--show-only "templates/${template}.yaml")
  done
  {
    tl::chart::render --set scheduling.mode=clusterScheduler --set dra.enabled=true \
      --set 'extender.leaseNamespaces={*}' --set 'orchestrator.namespaces={*}' \
      --set 'extender.leaseWorkloads[0].apiGroup=workloads.tidelease.test' \
      --set 'extender.leaseWorkloads[0].resource=leaderworkersets' \
      --set extender.controllers.hotRestartOperator=true --set extender.controllers.queues=true \
      --set extender.controllers.kueue=true \
      --set agent.hotRestart.enabled=true \
      "${shown[@]}" | "${TL_PY}" -c '
import sys

import yaml

grants = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
          "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
cluster_wide = {"ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy",
                "ValidatingAdmissionPolicyBinding"}
kept = [doc for doc in yaml.safe_load_all(sys.stdin) if doc and doc["kind"] in grants]
for doc in kept:
    labels = doc["metadata"].setdefault("labels", {})
    labels.update({"app.kubernetes.io/instance": "local", "app.kubernetes.io/managed-by": "hack"})
    if doc["kind"] in cluster_wide:
        doc["metadata"]["name"] += "-local"
    if doc.get("roleRef", {}).get("kind") == "ClusterRole":
        doc["roleRef"]["name"] += "-local"
    if doc["kind"] == "ValidatingAdmissionPolicyBinding":
        doc["spec"]["policyName"] += "-local"
yaml.safe_dump_all(kept, sys.stdout)
' | tl::cluster::_kubectl apply -f - &&
      for account in tidelease-extender tidelease-controllers tidelease-orchestrator; do
        tl::account_kubeconfig "${TL_CP_KUBECONFIG}" \
          "$(tl::cluster::account_kubeconfig "${account}")" "${TL_CLUSTER_NAMESPACE}/${account}" ||
          return 1
      done
  } >"${log}" 2>&1 || tl::cp::_fail "applying the chart's grants" "${log}"
}

# tl::cluster::account_kubeconfig ACCOUNT - where the kubeconfig of the chart's ServiceAccount
# ACCOUNT is (DIR/accounts/ACCOUNT.kubeconfig; tests/e2e/harness.py's Cluster.as_account).
tl::cluster::account_kubeconfig() {
  mkdir -p "${TL_CLUSTER_DIR}/accounts"
  printf '%s/accounts/%s.kubeconfig\n' "${TL_CLUSTER_DIR}" "$1"
}

# tl::cluster::create_nodes COUNT [PREFIX] - kwok GPU nodes and their GpuNode objects.
tl::cluster::create_nodes() {
  local count="$1" prefix="${2:-${TL_CLUSTER_NODE_PREFIX}}"
  ((count > 0)) || return 0
  "${TL_PY}" "${TL_HACK}/cluster-nodes.py" --server "${TL_CP_SERVER}" --token "${TL_CP_TOKEN}" \
    --ca "${TL_CP_CA}" --count "${count}" --prefix "${prefix}" \
    --gpus "${TL_CLUSTER_GPUS_PER_NODE}" --gpu-type "${TL_CLUSTER_GPU_TYPE}" \
    --topology "${TL_CLUSTER_NODE_TOPOLOGY}" \
    >>"${TL_CLUSTER_DIR}/logs/nodes.log" 2>&1 ||
    tl::cp::_fail "creating ${count} kwok nodes" "${TL_CLUSTER_DIR}/logs/nodes.log"
}

# tl::cluster::start_controller_manager - kube-controller-manager with the admin kubeconfig and
# the control plane's service-account key; serves /healthz on a free loopback port.
tl::cluster::start_controller_manager() {
  local port log
  port="$(tl::free_port)"
  log="${TL_CLUSTER_DIR}/logs/kube-controller-manager.log"
  mkdir -p "${TL_CLUSTER_DIR}/kcm"
  "$(tl::bin kube-controller-manager)" \
    --kubeconfig="${TL_CP_KUBECONFIG}" \
    --bind-address=127.0.0.1 \
    --secure-port="${port}" \
    --cert-dir="${TL_CLUSTER_DIR}/kcm" \
    --leader-elect=false \
    --use-service-account-credentials=false \
    --service-account-private-key-file="${TL_CLUSTER_DIR}/auth/sa.key" \
    --root-ca-file="${TL_CP_CA}" \
    --cluster-name=tidelease \
    --node-monitor-grace-period="${TL_CLUSTER_NODE_GRACE}" \
    --kube-api-qps="${TL_CLUSTER_KCM_QPS}" \
    --kube-api-burst="${TL_CLUSTER_KCM_BURST}" \
    --v="${TL_CLUSTER_VERBOSITY}" \
    >"${log}" 2>&1 &
  TL_CLUSTER_KCM_PID=$!
  tl::cluster::record_pid TL_CLUSTER_KCM_PID "${TL_CLUSTER_KCM_PID}"
  TL_CLUSTER_KCM_URL="https://127.0.0.1:${port}"
  tl::log "started kube-controller-manager on ${TL_CLUSTER_KCM_URL} (pid ${TL_CLUSTER_KCM_PID})"
}

# TL_CLUSTER_KWOK_RUNS_FOREVER: the pod annotation that keeps kwok from completing a pod a Job
# owns (its default pod stages mark such a pod Succeeded the moment it runs).
TL_CLUSTER_KWOK_RUNS_FOREVER="tidelease.test/kwok-runs-forever"

# tl::cluster::kwok_stages - kwok's own stages, read from the pinned kwok module, given in the
# configuration (they replace kwok's defaults):
# - nodes: node-initialize, then node-heartbeat-with-lease (the node's status every 10-20 min,
#   its Lease every quarter of TL_CLUSTER_NODE_LEASE_S), as a kubelet with node leases reports.
#   kwok v0.7.0's default with a lease is the other heartbeat, the status every 20-45 s: on
#   1,250 nodes that was half the API server's requests, and it delayed kwok's own work (a
#   deleted pod gone 10 s late at dawn; docs/performance.md#dawn).
# - pods: the "fast" ones (ready, complete, delete), but a Job's pod annotated
#   TL_CLUSTER_KWOK_RUNS_FOREVER stays Running (tests/e2e/test_kueue.py: Kueue's Jobs must run
#   until they are evicted).
tl::cluster::kwok_stages() {
  local dir
  dir="$(tl::module_dir sigs.k8s.io/kwok "${KWOK_VERSION}" kustomize/stage)"
  "${TL_PY}" - "${dir}/kustomize/stage" "${TL_CLUSTER_KWOK_RUNS_FOREVER}" <<'EOF'
import sys

import yaml

src, annotation = sys.argv[1:]
docs = []
for path in (
    "node/fast/node-initialize",
    "node/heartbeat-with-lease/node-heartbeat-with-lease",
    "pod/fast/pod-ready",
    "pod/fast/pod-complete",
    "pod/fast/pod-delete",
):
    with open(f"{src}/{path}.yaml") as f:
        stage = yaml.safe_load(f)
    if path.endswith("/pod-complete"):
        stage["spec"]["selector"]["matchExpressions"].append(
            {"key": f'.metadata.annotations["{annotation}"]', "operator": "DoesNotExist"}
        )
    docs.append(stage)
print(yaml.safe_dump_all(docs, sort_keys=False, explicit_start=True), end="")
EOF
}

# tl::cluster::start_kwok - kwok managing the nodes annotated kwok.x-k8s.io/node=fake, with its
# stages (nodes Ready, pods Running; tl::cluster::kwok_stages); no server port of
# its own.
tl::cluster::start_kwok() {
  local log="${TL_CLUSTER_DIR}/logs/kwok.log" config="${TL_CLUSTER_DIR}/kwok.yaml" stages
  stages="$(tl::cluster::kwok_stages)" || tl::die "kwok's stages"
  # An explicit configuration, so ~/.kwok/kwok.yaml of whoever runs this plays no part.
  cat >"${config}" <<EOF
apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokConfiguration
options: {}
${stages}
EOF
  "$(tl::bin kwok)" \
    --config="${config}" \
    --kubeconfig="${TL_CP_KUBECONFIG}" \
    --manage-all-nodes=false \
    --manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake \
    --node-lease-duration-seconds="${TL_CLUSTER_NODE_LEASE_S}" \
    --cidr=10.0.0.1/16 \
    --node-ip=10.0.0.1 \
    >"${log}" 2>&1 &
  TL_CLUSTER_KWOK_PID=$!
  tl::cluster::record_pid TL_CLUSTER_KWOK_PID "${TL_CLUSTER_KWOK_PID}"
  tl::log "started kwok (pid ${TL_CLUSTER_KWOK_PID})"
}

# tl::cluster::extender_certs - the extender's own CA, its serving certificate (the chart's
# Service name, and 127.0.0.1) and kube-scheduler's client certificate, laid out as the chart's
# Secrets are (tls.crt, tls.key, ca.crt): DIR/auth/extender/{serving,scheduler-client}.
tl::cluster::extender_certs() {
  local dir="${TL_CLUSTER_DIR}/auth/extender" log="${TL_CLUSTER_DIR}/logs/certs.log" leaf
  local -a ec=(-newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes)
  mkdir -p "${dir}/serving" "${dir}/scheduler-client"
  printf '%s\n' "basicConstraints=critical,CA:FALSE" "extendedKeyUsage=serverAuth" \
    "subjectAltName=DNS:tidelease-extender.tidelease-system.svc,IP:127.0.0.1" >"${dir}/serving.ext"
  printf '%s\n' "basicConstraints=critical,CA:FALSE" "extendedKeyUsage=clientAuth" \
    >"${dir}/scheduler-client.ext"
  {
    openssl req -x509 "${ec[@]}" -days 2 -subj /CN=tidelease-extender-ca \
      -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign \
      -keyout "${dir}/ca.key" -out "${dir}/ca.crt" &&
      for leaf in serving scheduler-client; do
        openssl req "${ec[@]}" -subj "/CN=tidelease-${leaf}" -keyout "${dir}/${leaf}/tls.key" \
          -out "${dir}/${leaf}.csr" &&
          openssl x509 -req -in "${dir}/${leaf}.csr" -CA "${dir}/ca.crt" -CAkey "${dir}/ca.key" \
            -CAcreateserial -days 2 -extfile "${dir}/${leaf}.ext" -out "${dir}/${leaf}/tls.crt" &&
          cp "${dir}/ca.crt" "${dir}/${leaf}/ca.crt" || return 1
      done
  } >"${log}" 2>&1 || tl::cp::_fail "making the extender's certificates" "${log}"
  chmod 0600 "${dir}"/*.key "${dir}"/*/tls.key
  TL_CLUSTER_EXTENDER_CERTS="${dir}"
}

# tl::cluster::queue_release_key - the key of the shared queues' release proofs
# (common/queuerelease.py), as the chart's Secret holds one: the extender refuses a pod of the
# queues without a proof made with it, and the queues controllers the tests start sign with it
# (TL_CLUSTER_DIR/queue-release.key).
tl::cluster::queue_release_key() {
  TL_CLUSTER_QUEUE_RELEASE_KEY="${TL_CLUSTER_DIR}/queue-release.key"
  (umask 077 && head -c 48 /dev/urandom | base64 >"${TL_CLUSTER_QUEUE_RELEASE_KEY}")
}

# tl::cluster::start_extender - the tidelease extender (.venv) as the chart runs it in the
# clusterScheduler mode: the verbs over HTTPS on a free loopback port, a client certificate of
# its own CA required (kube-scheduler's); /healthz, /readyz and /metrics on a port of their own,
# /metrics for a token allowed to get it (metrics_auth).
# TIDELEASE_EXTENDER_* variables in the environment reach it (see extender/scheduler/settings.py).
tl::cluster::start_extender() {
  local port probe_port log="${TL_CLUSTER_DIR}/logs/extender.log"
  local serving="${TL_CLUSTER_EXTENDER_CERTS}/serving"
  port="$(tl::free_port)"
  probe_port="$(tl::free_port)"
  TL_CLUSTER_EXTENDER_URL="https://127.0.0.1:${port}"
  TL_CLUSTER_EXTENDER_PROBE_URL="http://127.0.0.1:${probe_port}"
  TIDELEASE_EXTENDER_LEASING_TEST_GRACE_S="${TL_CLUSTER_LEASING_GRACE_S}" \
    TIDELEASE_EXTENDER_METRICS_AUTH="${TIDELEASE_EXTENDER_METRICS_AUTH:-true}" \
    TIDELEASE_EXTENDER_QUEUE_RELEASE_KEY_FILE="${TL_CLUSTER_QUEUE_RELEASE_KEY}" \
    "${TL_VENV}/bin/tidelease" --log-level "${TL_CLUSTER_EXTENDER_LOG_LEVEL}" extender \
    --kubeconfig "$(tl::cluster::account_kubeconfig tidelease-extender)" --host 127.0.0.1 --port "${port}" \
    --probe-host 127.0.0.1 --probe-port "${probe_port}" \
    --tls-cert-file "${serving}/tls.crt" --tls-key-file "${serving}/tls.key" \
    --client-ca-file "${serving}/ca.crt" \
    >"${log}" 2>&1 &
  TL_CLUSTER_EXTENDER_PID=$!
  tl::cluster::record_pid TL_CLUSTER_EXTENDER_PID "${TL_CLUSTER_EXTENDER_PID}"
  tl::log "started extender on ${TL_CLUSTER_EXTENDER_URL} (pid ${TL_CLUSTER_EXTENDER_PID})"
}

# tl::cluster::start_controllers - `tidelease controllers` (.venv): the leasing controller, the
# hot-restart operator and the prewarm controller, each leader-elected, as the chart's
# controllers Deployment runs them (it also runs the planner, which needs a Prometheus);
# /healthz, /readyz and /metrics (for allowed tokens) on a free loopback port.
# TL_CLUSTER_CONTROLLER_FLAGS names others (hack/bench-scale.py: the chart's defaults; the soak
# adds --queues-controller, which signs its releases with the cluster's key).
tl::cluster::start_controllers() {
  local port log="${TL_CLUSTER_DIR}/logs/controllers.log" flags
  read -r -a flags <<<"${TL_CLUSTER_CONTROLLER_FLAGS}"
  port="$(tl::free_port)"
  TL_CLUSTER_CONTROLLERS_URL="http://127.0.0.1:${port}"
  TIDELEASE_EXTENDER_LEASING_TEST_GRACE_S="${TL_CLUSTER_LEASING_GRACE_S}" \
    TIDELEASE_EXTENDER_METRICS_AUTH="${TIDELEASE_EXTENDER_METRICS_AUTH:-true}" \
    TIDELEASE_EXTENDER_DRA="${TL_CLUSTER_LEASING_DRA}" \
    TIDELEASE_EXTENDER_QUEUE_RELEASE_KEY_FILE="${TL_CLUSTER_QUEUE_RELEASE_KEY}" \
    "${TL_VENV}/bin/tidelease" --log-level "${TL_CLUSTER_EXTENDER_LOG_LEVEL}" controllers \
    --kubeconfig "$(tl::cluster::account_kubeconfig tidelease-controllers)" --probe-host 127.0.0.1 --probe-port "${port}" \
    "${flags[@]}" >"${log}" 2>&1 &
  TL_CLUSTER_CONTROLLERS_PID=$!
  tl::cluster::record_pid TL_CLUSTER_CONTROLLERS_PID "${TL_CLUSTER_CONTROLLERS_PID}"
  tl::log "started controllers (pid ${TL_CLUSTER_CONTROLLERS_PID}), probes ${TL_CLUSTER_CONTROLLERS_URL}"
}

# tl::cluster::scheduler_config OUT NAME WITH_EXTENDER - the chart's KubeSchedulerConfiguration
# for the cluster's own kube-scheduler (scheduling.mode=clusterScheduler) rewritten for this
# cluster: the local kubeconfig, no leader election, the local extender's URL and client
# certificate (or no extenders), profile NAME.
tl::cluster::scheduler_config() {
  local out="$1" name="$2" with_extender="$3"
  tl::chart::render --set scheduling.mode=clusterScheduler \
    --set "scheduling.clientCertDir=${TL_CLUSTER_EXTENDER_CERTS}/scheduler-client" \
    --show-only templates/scheduler-config.yaml >"${out}.configmap"
  "${TL_PY}" - "${out}.configmap" "${out}" "${name}" \
    "${with_extender}" "${TL_CP_KUBECONFIG}" "${TL_CLUSTER_EXTENDER_URL}" \
    "${TL_CLUSTER_SCHEDULER_QPS}" "${TL_CLUSTER_SCHEDULER_BURST}" <<'EOF'
import sys

import yaml

src, out, name, with_extender, kubeconfig, url, qps, burst = sys.argv[1:]
with open(src) as f:
    cfg = yaml.safe_load(yaml.safe_load(f)["data"]["config.yaml"])
cfg.setdefault("clientConnection", {})["kubeconfig"] = kubeconfig
if qps:
    cfg["clientConnection"]["qps"] = float(qps)
if burst:
    cfg["clientConnection"]["burst"] = int(burst)
cfg["leaderElection"] = {"leaderElect": False}
cfg["profiles"] = [{"schedulerName": name}]
if with_extender == "true":
    extenders = cfg.get("extenders") or []
    if len(extenders) != 1:
        sys.exit(f"{src}: want exactly one extender, found {len(extenders)}")
    extenders[0]["urlPrefix"] = url
else:
    cfg.pop("extenders", None)
with open(out, "w") as f:
    yaml.safe_dump(cfg, f, sort_keys=False)
EOF
}

# tl::cluster::_start_scheduler NAME WITH_EXTENDER - a kube-scheduler for profile NAME; sets
# TL_CLUSTER__LAST_PID and TL_CLUSTER__LAST_URL (its secure port on loopback: /healthz, and
# /metrics without credentials, for hack/bench-scale.py).
tl::cluster::_start_scheduler() {
  local name="$1" with_extender="$2" port dir log
  port="$(tl::free_port)"
  dir="${TL_CLUSTER_DIR}/scheduler-${name}"
  log="${TL_CLUSTER_DIR}/logs/kube-scheduler-${name}.log"
  mkdir -p "${dir}"
  tl::cluster::scheduler_config "${dir}/config.yaml" "${name}" "${with_extender}"
  "$(tl::bin kube-scheduler)" \
    --config="${dir}/config.yaml" \
    --bind-address=127.0.0.1 \
    --authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics \
    --secure-port="${port}" \
    --cert-dir="${dir}" \
    --feature-gates=GenericWorkload=true,GangScheduling=true \
    --v="${TL_CLUSTER_SCHEDULER_VERBOSITY}" \
    >"${log}" 2>&1 &
  TL_CLUSTER__LAST_PID=$!
  tl::cluster::record_pid "TL_CLUSTER_SCHEDULER_${name//-/_}_PID" "${TL_CLUSTER__LAST_PID}"
  TL_CLUSTER__LAST_URL="https://127.0.0.1:${port}"
  tl::log "started kube-scheduler ${name} on ${TL_CLUSTER__LAST_URL} (pid ${TL_CLUSTER__LAST_PID})"
}

tl::cluster::start_schedulers() {
  tl::cluster::_start_scheduler default-scheduler true
  TL_CLUSTER_SCHEDULER_PID="${TL_CLUSTER__LAST_PID}"
  TL_CLUSTER_SCHEDULER_URL="${TL_CLUSTER__LAST_URL}"
  TL_CLUSTER_PLAIN_SCHEDULER_URL=""
  if [[ "${TL_CLUSTER_PLAIN_SCHEDULER}" == true ]]; then
    tl::cluster::_start_scheduler "${TL_CLUSTER_PLAIN_SCHEDULER_NAME}" false
    TL_CLUSTER_PLAIN_SCHEDULER_PID="${TL_CLUSTER__LAST_PID}"
    TL_CLUSTER_PLAIN_SCHEDULER_URL="${TL_CLUSTER__LAST_URL}"
  fi
}

# tl::cluster::wait_nodes_ready COUNT - until COUNT kwok nodes report Ready and carry no taint:
# nodes are created with node.kubernetes.io/not-ready (admission), which the controller manager
# lifts only after kwok reports them Ready; until then kube-scheduler turns pods away.
tl::cluster::wait_nodes_ready() {
  local want="$1" ready deadline
  ((want > 0)) || return 0
  deadline=$((SECONDS + TL_CLUSTER_READY_TIMEOUT))
  while true; do
    ready="$(tl::cluster::_kubectl get nodes -l type=kwok -o \
      jsonpath='{range .items[*]}{range .status.conditions[?(@.type=="Ready")]}{.status}{end} {.spec.taints[*].key}{"\n"}{end}' \
      2>/dev/null | grep -c '^True $' || true)"
    ((ready >= want)) && return 0
    tl::cp::_alive "${TL_CLUSTER_KWOK_PID}" || tl::cp::_fail kwok "${TL_CLUSTER_DIR}/logs/kwok.log"
    ((SECONDS < deadline)) ||
      tl::cp::_fail "kwok (${ready}/${want} nodes Ready and untainted after ${TL_CLUSTER_READY_TIMEOUT}s)" \
        "${TL_CLUSTER_DIR}/logs/kwok.log"
    sleep 0.3
  done
}

# tl::cluster::kubelet_client_certs - a CA of its own and, signed by it, the API server's client
# certificate for kubelets: the real node's kubelet admits only holders of that CA's certificates
# (logs, exec, port-forward come from the API server). Adds the API server's flags.
tl::cluster::kubelet_client_certs() {
  local dir="${TL_CLUSTER_DIR}/auth/kubelet" log="${TL_CLUSTER_DIR}/logs/certs.log"
  mkdir -p "${dir}"
  {
    openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=tidelease-kubelet-client-ca \
      -keyout "${dir}/ca.key" -out "${dir}/ca.crt" &&
      openssl req -newkey rsa:2048 -nodes -subj /O=system:masters/CN=kube-apiserver-kubelet-client \
        -keyout "${dir}/client.key" -out "${dir}/client.csr" &&
      openssl x509 -req -in "${dir}/client.csr" -CA "${dir}/ca.crt" -CAkey "${dir}/ca.key" \
        -CAcreateserial -days 2 -out "${dir}/client.crt"
  } >"${log}" 2>&1 || tl::cp::_fail "making the kubelet client certificates" "${log}"
  chmod 0600 "${dir}"/*.key
  TL_CLUSTER_KUBELET_CLIENT_CA="${dir}/ca.crt"
  TL_CP_APISERVER_EXTRA_ARGS="${TL_CP_APISERVER_EXTRA_ARGS:-} --kubelet-client-certificate=${dir}/client.crt --kubelet-client-key=${dir}/client.key --kubelet-preferred-address-types=InternalIP"
}

# tl::cluster::_launch_real_node KEY NAME DIR LOG ARGS... - hack/realnode.sh for node NAME in DIR
# (its own supervisor: it drains and removes everything when it gets SIGTERM, or when this shell
# is gone), in the background; sets TL_CLUSTER__LAST_PID, recorded under KEY.
tl::cluster::_launch_real_node() {
  local key="$1" name="$2" dir="$3" log="$4"
  shift 4
  TL_REALNODE_PARENT_PID="$$" TL_CLUSTER_GPU_TYPE="${TL_CLUSTER_GPU_TYPE}" \
    "${TL_HACK}/realnode.sh" -D "${dir}" -k "${TL_CP_KUBECONFIG}" -n "${name}" \
    -c "${TL_CLUSTER_KUBELET_CLIENT_CA}" -s "${TL_CLUSTER_NAMESPACE}/tidelease-agent" "$@" \
    >"${log}" 2>&1 &
  TL_CLUSTER__LAST_PID=$!
  tl::cluster::record_pid "${key}" "${TL_CLUSTER__LAST_PID}"
  tl::log "starting real node ${name} (pid ${TL_CLUSTER__LAST_PID})"
}

# tl::cluster::_wait_real_node PID DIR LOG - until DIR/realnode.env appears: the node is Ready
# and offers (or, in DRA mode, publishes) its GPUs.
tl::cluster::_wait_real_node() {
  local pid="$1" dir="$2" log="$3" deadline
  deadline=$((SECONDS + TL_CLUSTER_READY_TIMEOUT))
  until [[ -f "${dir}/realnode.env" ]]; do
    tl::cp::_alive "${pid}" || tl::cp::_fail "real node" "${log}"
    ((SECONDS < deadline)) || tl::cp::_fail "real node (not ready after ${TL_CLUSTER_READY_TIMEOUT}s)" "${log}"
    sleep 0.3
  done
}

# tl::cluster::start_real_nodes - the real node (DIR/realnode, extender mode) and/or the real
# DRA node (DIR/realdra), started together; waits until both are ready.
tl::cluster::start_real_nodes() {
  local dir="${TL_CLUSTER_DIR}/realnode" log="${TL_CLUSTER_DIR}/logs/realnode.log"
  local dra_dir="${TL_CLUSTER_DIR}/realdra" dra_log="${TL_CLUSTER_DIR}/logs/realdra.log" gpus
  if [[ "${TL_CLUSTER_REAL_NODE}" == true ]]; then
    tl::cluster::_launch_real_node TL_CLUSTER_REAL_NODE_PID "${TL_CLUSTER_REAL_NODE_NAME}" \
      "${dir}" "${log}" -g "${TL_CLUSTER_REAL_NODE_GPUS}" -L "${TL_CLUSTER_DIR}/logs/realnode" \
      ${TL_CLUSTER_REAL_NODE_CACHE_MIB:+-C "${TL_CLUSTER_REAL_NODE_CACHE_MIB}"} \
      ${TL_CLUSTER_REAL_NODE_TOPOLOGY:+-T "${TL_CLUSTER_REAL_NODE_TOPOLOGY}"}
    TL_CLUSTER_REAL_NODE_PID="${TL_CLUSTER__LAST_PID}"
  fi
  if [[ "${TL_CLUSTER_REAL_DRA_NODE}" == true ]]; then
    gpus="$(tr ',' '\n' <<<"${TL_CLUSTER_REAL_DRA_NODE_TIERS}" | wc -l)"
    TL_CLUSTER_REAL_DRA_NODE_GPUS="${gpus}"
    tl::cluster::_launch_real_node TL_CLUSTER_REAL_DRA_NODE_PID \
      "${TL_CLUSTER_REAL_DRA_NODE_NAME}" "${dra_dir}" "${dra_log}" -d -g "${gpus}" \
      -t "${TL_CLUSTER_REAL_DRA_NODE_TIERS}" -L "${TL_CLUSTER_DIR}/logs/realdra"
    TL_CLUSTER_REAL_DRA_NODE_PID="${TL_CLUSTER__LAST_PID}"
  fi
  if [[ -n "${TL_CLUSTER_REAL_NODE_PID}" ]]; then
    tl::cluster::_wait_real_node "${TL_CLUSTER_REAL_NODE_PID}" "${dir}" "${log}"
    TL_CLUSTER_REAL_NODE_IP="$(tl::cluster::read_state "${dir}/realnode.env" TL_REALNODE_IP)"
    TL_CLUSTER_REAL_NODE_CTRD_SOCK="$(tl::cluster::read_state "${dir}/realnode.env" TL_REALNODE_CTRD_SOCK)"
    TL_CLUSTER_REAL_NODE_GATEWAY="$(tl::cluster::read_state "${dir}/realnode.env" TL_REALNODE_GATEWAY)"
  fi
  if [[ -n "${TL_CLUSTER_REAL_DRA_NODE_PID}" ]]; then
    tl::cluster::_wait_real_node "${TL_CLUSTER_REAL_DRA_NODE_PID}" "${dra_dir}" "${dra_log}"
    TL_CLUSTER_REAL_DRA_NODE_IP="$(tl::cluster::read_state "${dra_dir}/realnode.env" TL_REALNODE_IP)"
    TL_CLUSTER_REAL_DRA_NODE_CTRD_SOCK="$(tl::cluster::read_state "${dra_dir}/realnode.env" TL_REALNODE_CTRD_SOCK)"
    TL_CLUSTER_REAL_DRA_NODE_CDI_DIR="$(tl::cluster::read_state "${dra_dir}/realnode.env" TL_REALNODE_CDI_DIR)"
    TL_CLUSTER_REAL_DRA_NODE_GATEWAY="$(tl::cluster::read_state "${dra_dir}/realnode.env" TL_REALNODE_GATEWAY)"
  fi
}

# tl::cluster::write_state - the cluster's facts, KEY=VALUE per line, written atomically.
tl::cluster::write_state() {
  local state tmp key value
  state="$(tl::cluster::state_file)"
  tmp="${state}.tmp"
  local -a pairs=(
    KUBECONFIG "${TL_CP_KUBECONFIG}"
    TL_CLUSTER_DIR "${TL_CLUSTER_DIR}"
    TL_CLUSTER_SERVER "${TL_CP_SERVER}"
    TL_CLUSTER_TOKEN "${TL_CP_TOKEN}"
    TL_CLUSTER_CA "${TL_CP_CA}"
    TL_CLUSTER_ETCD_URL "${TL_CP_ETCD_URL}"
    TL_CLUSTER_EXTENDER_URL "${TL_CLUSTER_EXTENDER_URL}"
    TL_CLUSTER_EXTENDER_PROBE_URL "${TL_CLUSTER_EXTENDER_PROBE_URL}"
    TL_CLUSTER_CONTROLLERS_URL "${TL_CLUSTER_CONTROLLERS_URL}"
    TL_CLUSTER_EXTENDER_CLIENT_CERTS "${TL_CLUSTER_EXTENDER_CERTS}/scheduler-client"
    TL_CLUSTER_SCHEDULER_URL "${TL_CLUSTER_SCHEDULER_URL}"
    TL_CLUSTER_PLAIN_SCHEDULER_URL "${TL_CLUSTER_PLAIN_SCHEDULER_URL}"
    TL_CLUSTER_PLAIN_SCHEDULER_NAME "$([[ "${TL_CLUSTER_PLAIN_SCHEDULER}" == true ]] && printf '%s' "${TL_CLUSTER_PLAIN_SCHEDULER_NAME}")"
    TL_CLUSTER_KCM_URL "${TL_CLUSTER_KCM_URL}"
    TL_CLUSTER_NODES "${TL_CLUSTER_NODES}"
    TL_CLUSTER_NODE_PREFIX "${TL_CLUSTER_NODE_PREFIX}"
    TL_CLUSTER_GPUS_PER_NODE "${TL_CLUSTER_GPUS_PER_NODE}"
    TL_CLUSTER_GPU_TYPE "${TL_CLUSTER_GPU_TYPE}"
    TL_CLUSTER_REAL_NODE "$([[ "${TL_CLUSTER_REAL_NODE}" == true ]] && printf '%s' "${TL_CLUSTER_REAL_NODE_NAME}")"
    TL_CLUSTER_REAL_NODE_IP "${TL_CLUSTER_REAL_NODE_IP}"
    TL_CLUSTER_REAL_NODE_GPUS "$([[ "${TL_CLUSTER_REAL_NODE}" == true ]] && printf '%s' "${TL_CLUSTER_REAL_NODE_GPUS}")"
    TL_CLUSTER_REAL_NODE_CTRD_SOCK "${TL_CLUSTER_REAL_NODE_CTRD_SOCK}"
    TL_CLUSTER_REAL_NODE_GATEWAY "${TL_CLUSTER_REAL_NODE_GATEWAY}"
    TL_CLUSTER_REAL_DRA_NODE "$([[ "${TL_CLUSTER_REAL_DRA_NODE}" == true ]] && printf '%s' "${TL_CLUSTER_REAL_DRA_NODE_NAME}")"
    TL_CLUSTER_REAL_DRA_NODE_IP "${TL_CLUSTER_REAL_DRA_NODE_IP}"
    TL_CLUSTER_REAL_DRA_NODE_GPUS "${TL_CLUSTER_REAL_DRA_NODE_GPUS}"
    TL_CLUSTER_REAL_DRA_NODE_GATEWAY "${TL_CLUSTER_REAL_DRA_NODE_GATEWAY}"
    # Dash-separated here: state values hold no commas.
    TL_CLUSTER_REAL_DRA_NODE_TIERS "$([[ "${TL_CLUSTER_REAL_DRA_NODE}" == true ]] && printf '%s' "${TL_CLUSTER_REAL_DRA_NODE_TIERS//,/-}")"
    TL_CLUSTER_REAL_DRA_NODE_CTRD_SOCK "${TL_CLUSTER_REAL_DRA_NODE_CTRD_SOCK}"
    TL_CLUSTER_REAL_DRA_NODE_CDI_DIR "${TL_CLUSTER_REAL_DRA_NODE_CDI_DIR}"
    TL_CLUSTER_KUBELET_CLIENT_CA "${TL_CLUSTER_KUBELET_CLIENT_CA:-}"
    TL_CLUSTER_LOGS "${TL_CLUSTER_DIR}/logs"
    TL_CLUSTER_KUBECTL "$(tl::bin kubectl)"
    TL_CLUSTER_SUPERVISOR_PID "$$"
    TL_CLUSTER_ETCD_PID "${TL_CP_ETCD_PID}"
    TL_CLUSTER_APISERVER_PID "${TL_CP_APISERVER_PID}"
    TL_CLUSTER_KCM_PID "${TL_CLUSTER_KCM_PID}"
    TL_CLUSTER_KWOK_PID "${TL_CLUSTER_KWOK_PID}"
    TL_CLUSTER_EXTENDER_PID "${TL_CLUSTER_EXTENDER_PID}"
    TL_CLUSTER_CONTROLLERS_PID "${TL_CLUSTER_CONTROLLERS_PID}"
    TL_CLUSTER_SCHEDULER_PID "${TL_CLUSTER_SCHEDULER_PID}"
    TL_CLUSTER_PLAIN_SCHEDULER_PID "${TL_CLUSTER_PLAIN_SCHEDULER_PID}"
    TL_CLUSTER_REAL_NODE_PID "${TL_CLUSTER_REAL_NODE_PID}"
    TL_CLUSTER_REAL_DRA_NODE_PID "${TL_CLUSTER_REAL_DRA_NODE_PID}"
  )
  : >"${tmp}"
  chmod 0600 "${tmp}"
  while ((${#pairs[@]} > 0)); do
    key="${pairs[0]}" value="${pairs[1]}"
    pairs=("${pairs[@]:2}")
    # Values are sourced by shells and split by tests on the first '=': keep them plain.
    [[ "${value}" =~ ^[A-Za-z0-9_./:=+-]*$ ]] || tl::die "state value of ${key} is not plain: ${value}"
    printf '%s=%s\n' "${key}" "${value}" >>"${tmp}"
  done
  mv "${tmp}" "${state}"
}

# tl::cluster::start - everything, in dependency order, started in parallel where it can be.
tl::cluster::start() {
  local start
  start="$(tl::now_s)"
  tl::cluster::init_dir
  tl::cluster::record_pid TL_CLUSTER_SUPERVISOR_PID "$$"
  [[ "${TL_CLUSTER_REAL_NODE}" != true && "${TL_CLUSTER_REAL_DRA_NODE}" != true ]] ||
    tl::cluster::kubelet_client_certs
  tl::cp::start_etcd
  tl::cluster::record_pid TL_CLUSTER_ETCD_PID "${TL_CP_ETCD_PID}"
  # MutatingAdmissionPolicy (beta, off by default in this release): the chart's optional policy
  # that gates class-declaring GPU pods for the queues controller (docs/planner.md).
  # The Workload API (alpha): gangs placed whole by kube-scheduler's gang scheduling
  # (docs/gangs.md), as the chart's scheduling.gangScheduling asks of the API server.
  TL_CP_APISERVER_EXTRA_ARGS="${TL_CP_APISERVER_EXTRA_ARGS:-} --feature-gates=MutatingAdmissionPolicy=true,GenericWorkload=true --runtime-config=admissionregistration.k8s.io/v1beta1=true,scheduling.k8s.io/v1alpha1=true"
  tl::cp::start_apiserver
  tl::cluster::record_pid TL_CLUSTER_APISERVER_PID "${TL_CP_APISERVER_PID}"
  tl::cp::wait_ready
  # Nothing below needs the others to be ready, except the extender: it lists GpuNodes at start,
  # so it comes after the CRDs and the nodes.
  tl::cluster::start_controller_manager
  tl::cluster::start_kwok
  tl::cluster::apply_manifests
  tl::cluster::apply_grants
  tl::cluster::create_nodes "${TL_CLUSTER_NODES}"
  tl::cluster::extender_certs
  tl::cluster::queue_release_key
  tl::cluster::start_extender
  tl::cluster::start_controllers
  tl::cluster::start_schedulers

  tl::cluster::_wait_http kube-controller-manager "${TL_CLUSTER_KCM_PID}" \
    "${TL_CLUSTER_KCM_URL}/healthz" "${TL_CLUSTER_DIR}/logs/kube-controller-manager.log"
  tl::cluster::_wait_http extender "${TL_CLUSTER_EXTENDER_PID}" \
    "${TL_CLUSTER_EXTENDER_PROBE_URL}/readyz" "${TL_CLUSTER_DIR}/logs/extender.log"
  tl::cluster::_wait_http controllers "${TL_CLUSTER_CONTROLLERS_PID}" \
    "${TL_CLUSTER_CONTROLLERS_URL}/readyz" "${TL_CLUSTER_DIR}/logs/controllers.log"
  tl::cluster::_wait_http kube-scheduler "${TL_CLUSTER_SCHEDULER_PID}" \
    "${TL_CLUSTER_SCHEDULER_URL}/healthz" "${TL_CLUSTER_DIR}/logs/kube-scheduler-default-scheduler.log"
  if [[ -n "${TL_CLUSTER_PLAIN_SCHEDULER_PID}" ]]; then
    tl::cluster::_wait_http "kube-scheduler ${TL_CLUSTER_PLAIN_SCHEDULER_NAME}" \
      "${TL_CLUSTER_PLAIN_SCHEDULER_PID}" "${TL_CLUSTER_PLAIN_SCHEDULER_URL}/healthz" \
      "${TL_CLUSTER_DIR}/logs/kube-scheduler-${TL_CLUSTER_PLAIN_SCHEDULER_NAME}.log"
  fi
  tl::cluster::wait_nodes_ready "${TL_CLUSTER_NODES}"
  [[ "${TL_CLUSTER_REAL_NODE}" != true && "${TL_CLUSTER_REAL_DRA_NODE}" != true ]] ||
    tl::cluster::start_real_nodes
  tl::cluster::write_state
  tl::log "cluster ready in $(tl::elapsed "${start}")s: ${TL_CLUSTER_NODES} kwok GPU nodes, extender ${TL_CLUSTER_EXTENDER_URL}, state $(tl::cluster::state_file)"
}

# tl::cluster::component_died - name of the first component that is no longer running, if any.
tl::cluster::component_died() {
  local name pid
  for name in etcd:"${TL_CP_ETCD_PID}" kube-apiserver:"${TL_CP_APISERVER_PID}" \
    kube-controller-manager:"${TL_CLUSTER_KCM_PID}" kwok:"${TL_CLUSTER_KWOK_PID}" \
    extender:"${TL_CLUSTER_EXTENDER_PID}" controllers:"${TL_CLUSTER_CONTROLLERS_PID}" \
    kube-scheduler:"${TL_CLUSTER_SCHEDULER_PID}" \
    plain-scheduler:"${TL_CLUSTER_PLAIN_SCHEDULER_PID}" real-node:"${TL_CLUSTER_REAL_NODE_PID}" \
    real-dra-node:"${TL_CLUSTER_REAL_DRA_NODE_PID}"; do
    pid="${name#*:}"
    [[ -n "${pid}" ]] || continue
    if ! tl::cp::_alive "${pid}"; then
      printf '%s (pid %s)\n' "${name%%:*}" "${pid}"
      return 0
    fi
  done
  return 1
}

# tl::cluster::stop - stop what this shell started, dependents first; then remove the state file,
# and the directory unless TL_CLUSTER_KEEP_DIR=true. Idempotent; meant for an EXIT trap.
tl::cluster::stop() {
  # First, while the API server runs: the real nodes drain their pods through it (both at once).
  local pid
  for pid in "${TL_CLUSTER_REAL_NODE_PID}" "${TL_CLUSTER_REAL_DRA_NODE_PID}"; do
    [[ -z "${pid}" ]] || kill -TERM "${pid}" 2>/dev/null || true
  done
  if [[ -n "${TL_CLUSTER_REAL_NODE_PID}" ]]; then
    TL_CP_STOP_TIMEOUT=60 tl::cp::_kill "real node" "${TL_CLUSTER_REAL_NODE_PID}"
  fi
  if [[ -n "${TL_CLUSTER_REAL_DRA_NODE_PID}" ]]; then
    TL_CP_STOP_TIMEOUT=60 tl::cp::_kill "real DRA node" "${TL_CLUSTER_REAL_DRA_NODE_PID}"
  fi
  TL_CLUSTER_REAL_NODE_PID="" TL_CLUSTER_REAL_DRA_NODE_PID=""
  tl::cp::_kill "kube-scheduler ${TL_CLUSTER_PLAIN_SCHEDULER_NAME}" "${TL_CLUSTER_PLAIN_SCHEDULER_PID}"
  TL_CLUSTER_PLAIN_SCHEDULER_PID=""
  tl::cp::_kill kube-scheduler "${TL_CLUSTER_SCHEDULER_PID}"
  TL_CLUSTER_SCHEDULER_PID=""
  tl::cp::_kill extender "${TL_CLUSTER_EXTENDER_PID}"
  TL_CLUSTER_EXTENDER_PID=""
  tl::cp::_kill controllers "${TL_CLUSTER_CONTROLLERS_PID}"
  TL_CLUSTER_CONTROLLERS_PID=""
  tl::cp::_kill kwok "${TL_CLUSTER_KWOK_PID}"
  TL_CLUSTER_KWOK_PID=""
  tl::cp::_kill kube-controller-manager "${TL_CLUSTER_KCM_PID}"
  TL_CLUSTER_KCM_PID=""
  tl::cp::stop
  # Last: until everything is stopped, these let cluster-down find what is left.
  rm -f "$(tl::cluster::state_file)" "$(tl::cluster::pids_file)"
  if [[ -d "${TL_CLUSTER_DIR}" && -f "${TL_CLUSTER_DIR}/${TL_CLUSTER_MARKER}" ]]; then
    if [[ "${TL_CLUSTER_KEEP_DIR}" == true ]]; then
      tl::log "keeping ${TL_CLUSTER_DIR}"
    else
      rm -rf -- "${TL_CLUSTER_DIR}"
    fi
  fi
}
