#!/usr/bin/env bash
# A real node for the local cluster: Debian's containerd and a real kubelet (built by
# hack/build-binaries.sh), joined to the API server of KUBECONFIG as node NAME, running pods from
# the local images of hack/images.py (imagePullPolicy: Never). With -g N, the tidelease node
# agent runs beside it with N fake GPUs: its device plugin registers with this kubelet, so the
# node offers nvidia.com/gpu and containers get the devices the extender chose; and it does
# the node's hot restarts through this containerd (docs/hot-restart.md). With -a as well, no agent
# is started here: the agent runs as a pod of the tidelease chart's DaemonSet (the stand-in device
# nodes are made, and the pod network's bridge is up with its gateway address, so that a
# forwarder on that address can bring the pods to the API server).
#
# With -d (and -g), the node runs in DRA mode (docs/dra.md): containerd 2.x (built by
# hack/build-binaries.sh; Debian's 1.6 ignores CDI) reading CDI specs from DIR/cdi, and the agent
# with --dra --no-device-plugin: it publishes the node's ResourceSlice and serves the kubelet's
# DRA plugin in the kubelet's plugin dirs (under its --root-dir), so the node offers no
# nvidia.com/gpu, and containers get the devices of their claims through CDI. -t TIERS (HA, MA or
# LA per GPU, comma-separated) gives the fake GPUs those tiers: before the agent starts, its
# GpuNode gets an availability history from which the agent assesses them. With -d -a, the
# chart's agent pod (dra.enabled) serves the DRA plugin: the kubelet's plugin dirs and DIR/cdi are
# bound, in the node's mount namespace, at the paths the chart's DaemonSet mounts from the host
# (/var/lib/kubelet/plugins_registry, /var/lib/kubelet/plugins, /var/run/cdi). With -s NS/ACCOUNT, the
# agent started here runs as that ServiceAccount (the chart's tidelease-agent), with a token bound
# to this Node as the kubelet's tokens for the DaemonSet's pods are (minted with KUBECONFIG's
# credentials, which it otherwise uses): the chart's grants and own-node policy apply to it.
# With -C MIB (and an agent started here), the agent keeps its peer cache (docs/peer-cache.md)
# on a tmpfs of MIB MiB of this node's own (DIR/cache, in the node's mount namespace: a disk
# that a test can fill), pulls with a token of the agent's account for the cache's audience,
# bound to this Node, and serves the cache on a free port advertised as 127.0.0.1's
# (DIR/realnode.env: TL_REALNODE_CACHE_*). With -T LAYOUT (and an agent started here), the fake
# GPUs are connected as LAYOUT says (the agent's --fake-topology: nvswitch-8, pcie-2socket-8,
# nvlink-pairs-4; -g must match its count), published as the GpuNode's status.topology.
#
# usage: hack/realnode.sh -D DIR -k KUBECONFIG -n NAME [-g GPUS [-a] [-d [-t TIERS]] [-s NS/ACCOUNT]
#                         [-C CACHE_MIB] [-T LAYOUT]] [-c KUBELET_CLIENT_CA] [-L LOGS]
#
# Runs in the foreground until SIGINT/SIGTERM or until TL_REALNODE_PARENT_PID exits; then it
# deletes the node's pods, stops the agent, the kubelet and containerd, and removes everything
# (containers, mounts, bridge, cgroups, DIR; the logs stay when -L puts them elsewhere). Once the node is Ready (and with -g, offers its GPUs)
# it writes DIR/realnode.env (KEY=VALUE lines: TL_REALNODE_NAME, TL_REALNODE_IP,
# TL_REALNODE_CTRD_SOCK, TL_REALNODE_MODE (extender or dra), ...); in DRA mode "offers its GPUs"
# is: its ResourceSlice lists GPUS devices and the kubelet registered the DRA plugin.
#
# The node carries the taint tidelease.io/real-node=true:NoSchedule, so only pods that tolerate
# it land here. Everything runs in a private mount namespace: the kubelet insists on
# /var/lib/kubelet/device-plugins whatever its --root-dir, and there it sees DIR/device-plugins
# instead, so two runs on one machine never share a device-plugin directory. The kubelet serves
# on the host's address (a kubelet refuses a loopback node IP) and admits only clients with a
# certificate from KUBELET_CLIENT_CA (the API server's kubelet client certificate); without -c it
# falls back to anonymous access. See docs/real-node.md.
set -o errexit -o nounset -o pipefail

source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
source "${TL_HACK}/lib/containerd.sh"
source "${TL_HACK}/lib/python.sh"

usage() { sed -n '2,49p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }

DIR="" KUBECONFIG_PATH="" NAME="" GPUS=0 CLIENT_CA="" LOGS="" AGENT_IN_POD=false DRA=false TIERS=""
AGENT_ACCOUNT="" CACHE_MIB="" LAYOUT=""
while getopts ":D:k:n:g:c:L:adt:s:C:T:h" opt; do
  case "${opt}" in
    D) DIR="$(realpath -m -- "${OPTARG}")" ;;
    k) KUBECONFIG_PATH="$(realpath -- "${OPTARG}")" ;;
    n) NAME="${OPTARG}" ;;
    g) GPUS="${OPTARG}" ;;
    c) CLIENT_CA="$(realpath -- "${OPTARG}")" ;;
    L) LOGS="$(realpath -m -- "${OPTARG}")" ;;
    a) AGENT_IN_POD=true ;;
    d) DRA=true ;;
    t) TIERS="${OPTARG}" ;;
    s) AGENT_ACCOUNT="${OPTARG}" ;;
    C) CACHE_MIB="${OPTARG}" ;;
    T) LAYOUT="${OPTARG}" ;;
    h) usage; exit 0 ;;
    *) usage >&2; exit 2 ;;
  esac
done
[[ -n "${DIR}" && -n "${KUBECONFIG_PATH}" && -n "${NAME}" ]] || { usage >&2; exit 2; }
[[ "${GPUS}" =~ ^[0-9]+$ ]] || tl::die "-g wants a number of GPUs"
[[ "${NAME}" =~ ^[a-z0-9]([-a-z0-9]*[a-z0-9])?$ ]] || tl::die "-n ${NAME}: not a node name"
if [[ -n "${CACHE_MIB}" ]]; then
  [[ "${CACHE_MIB}" =~ ^[1-9][0-9]*$ ]] || tl::die "-C wants a size in MiB"
  ((GPUS > 0)) && [[ "${AGENT_IN_POD}" != true ]] || tl::die "-C goes with an agent started here (-g, not -a)"
fi
if [[ -n "${LAYOUT}" ]]; then
  [[ "${LAYOUT}" =~ ^[a-z0-9-]+$ ]] || tl::die "-T ${LAYOUT}: not a layout name"
  ((GPUS > 0)) && [[ "${AGENT_IN_POD}" != true ]] || tl::die "-T goes with an agent started here (-g, not -a)"
fi
MODE=extender
if [[ "${DRA}" == true ]]; then
  MODE=dra
  ((GPUS > 0)) || tl::die "-d (DRA mode) wants fake GPUs (-g)"
fi
if [[ -n "${TIERS}" ]]; then
  [[ "${DRA}" == true ]] || tl::die "-t (tiers) goes with -d"
  [[ "${AGENT_IN_POD}" != true ]] || tl::die "-t (tiers) goes with an agent started here (not -a)"
  [[ "${TIERS}" =~ ^(HA|MA|LA)(,(HA|MA|LA))*$ ]] ||
    tl::die "-t ${TIERS}: want HA, MA or LA per GPU, comma-separated"
  IFS=, read -r -a tier_list <<<"${TIERS}"
  ((${#tier_list[@]} == GPUS)) || tl::die "-t ${TIERS}: ${#tier_list[@]} tiers for ${GPUS} GPUs"
fi

PLUGIN_DIR_IN_NS=/var/lib/kubelet/device-plugins
# DRA mode with the chart's agent (-d -a): where its DaemonSet mounts the kubelet's plugin dirs
# and the CDI specs' dir from the host, bound here to this node's.
REGISTRY_DIR_IN_NS=/var/lib/kubelet/plugins_registry
PLUGINS_DIR_IN_NS=/var/lib/kubelet/plugins
CDI_DIR_IN_NS=/var/run/cdi
TAINT_KEY=tidelease.io/real-node
STOP_TIMEOUT="${TL_REALNODE_STOP_TIMEOUT:-30}"
READY_TIMEOUT="${TL_REALNODE_READY_TIMEOUT:-120}"

# A mount namespace of our own (see above); everything below runs in it.
if [[ "${TL_REALNODE_IN_NS:-}" != 1 ]]; then
  [[ "${EUID}" -eq 0 ]] || tl::die "a real node needs root (containerd, cgroups, mounts)"
  TL_REALNODE_IN_NS=1 exec unshare --mount --propagation private -- "${BASH_SOURCE[0]}" "$@"
fi

[[ ! -e "${DIR}" || -z "$(ls -A "${DIR}")" ]] || tl::die "${DIR} must be absent or empty"
LOGS="${LOGS:-${DIR}/logs}"
mkdir -p "${LOGS}" "${DIR}/device-plugins" "${DIR}/kubelet"
TL_CTRD_LOG_DIR="${LOGS}"
# DRA mode: the kubelet's plugin dirs, which it derives from its --root-dir (upstream's
# getPluginsRegistrationDir and getPluginsDir), and the CDI specs' dir.
REGISTRY_DIR="${DIR}/kubelet/plugins_registry"
PLUGINS_DIR="${DIR}/kubelet/plugins"
CDI_DIR=""
# The fake GPUs' UUIDs are the node's own, as real GPUs' are unique in a cluster: two real nodes
# of one cluster with the same UUIDs (the e2e real-0 and test_helm_install's helm-0) made the
# extender send a returning replica to the other node holding "its" devices.
FAKE_UUID_PREFIX="GPU-${NAME}"
if [[ "${DRA}" == true ]]; then
  CDI_DIR="${DIR}/cdi"
  mkdir -p "${CDI_DIR}"
  # A unix socket path holds at most 107 bytes: the DRA plugin's registration socket (in the
  # kubelet's plugins_registry, beside its plugins dir) is the longest one here.
  sock="$(dirname "${PLUGINS_DIR}")/plugins_registry/gpu.tidelease.io-reg.sock"
  ((${#sock} <= 107)) || tl::die "-D ${DIR} is too long for the DRA plugin's socket ${sock}"
fi
KUBELET="$(tl::bin kubelet)"
KUBECTL="$(tl::bin kubectl)"
KUBELET_PID="" AGENT_PID=""

kubectl() { "${KUBECTL}" --kubeconfig "${KUBECONFIG_PATH}" "$@"; }

# host_ip - the host's first global IPv4 address: the node's InternalIP.
host_ip() {
  ip -4 -o addr show scope global | awk '{ split($4, a, "/"); print a[1]; exit }'
}

stop_pid() {
  local name="$1" pid="$2" deadline
  [[ -n "${pid}" ]] && kill -0 "${pid}" 2>/dev/null || return 0
  tl::log "stopping ${name} (pid ${pid})"
  kill -TERM "${pid}" 2>/dev/null || true
  deadline=$((SECONDS + 10))
  while kill -0 "${pid}" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.1; done
  kill -KILL "${pid}" 2>/dev/null || true
}

# drain - delete the node's pods and let the kubelet tear their sandboxes down (network
# included) while it still runs; whatever is left is killed by tl::ctrd::stop.
drain() {
  local deadline
  [[ -n "${KUBELET_PID}" ]] && kill -0 "${KUBELET_PID}" 2>/dev/null || return 0
  kubectl delete pods --all-namespaces --field-selector "spec.nodeName=${NAME}" \
    --grace-period=0 --force --wait=false >/dev/null 2>&1 || true
  deadline=$((SECONDS + STOP_TIMEOUT))
  while [[ -n "$(tl::ctrd::ctr tasks ls -q 2>/dev/null)" ]] && ((SECONDS < deadline)); do
    sleep 0.3
  done
}

cleanup() {
  local rc=$?
  trap - EXIT
  trap '' INT TERM HUP
  rm -f "${DIR}/realnode.env"
  drain
  stop_pid "tidelease agent" "${AGENT_PID}"
  stop_pid kubelet "${KUBELET_PID}"
  kubectl delete node "${NAME}" --wait=false >/dev/null 2>&1 || true
  tl::ctrd::stop
  # The kubelet's own (its root directory, pod volumes) and ours.
  tl::umount_under "${DIR}"
  umount "${PLUGIN_DIR_IN_NS}" 2>/dev/null || true
  if [[ "${DRA}" == true && "${AGENT_IN_POD}" == true ]]; then
    umount "${REGISTRY_DIR_IN_NS}" "${PLUGINS_DIR_IN_NS}" "${CDI_DIR_IN_NS}" 2>/dev/null || true
  fi
  rm -rf -- "${DIR}"
  exit "${rc}"
}
trap cleanup EXIT
trap 'exit 0' INT TERM HUP

tl::ctrd::ensure_packages
tl::py::ensure >&2
NODE_IP="$(host_ip)"
[[ -n "${NODE_IP}" ]] ||
  tl::die "no global IPv4 address on this host: a kubelet needs a non-loopback node IP"

# The kubelet's fixed device-plugin directory, ours in this namespace.
mkdir -p "${PLUGIN_DIR_IN_NS}"
mount --bind "${DIR}/device-plugins" "${PLUGIN_DIR_IN_NS}"
if [[ "${DRA}" == true && "${AGENT_IN_POD}" == true ]]; then
  mkdir -p "${REGISTRY_DIR}" "${PLUGINS_DIR}" \
    "${REGISTRY_DIR_IN_NS}" "${PLUGINS_DIR_IN_NS}" "${CDI_DIR_IN_NS}"
  mount --bind "${REGISTRY_DIR}" "${REGISTRY_DIR_IN_NS}"
  mount --bind "${PLUGINS_DIR}" "${PLUGINS_DIR_IN_NS}"
  mount --bind "${CDI_DIR}" "${CDI_DIR_IN_NS}"
fi

if [[ "${DRA}" == true ]]; then
  tl::ctrd::use_v2
fi
tl::ctrd::init "${DIR}/containerd" "${CDI_DIR}"
tl::ctrd::start
CTRD_VERSION="$(tl::ctrd::server_version)"
if [[ "${DRA}" == true && "${CTRD_VERSION}" != v2.* ]]; then
  tl::die "DRA mode needs containerd 2.x (CDI), but containerd ${CTRD_VERSION:-of unknown version} answers on ${TL_CTRD_SOCK}"
fi
tl::ctrd::import_images

PORT="$(tl::free_port)"
HEALTHZ_PORT="$(tl::free_port)"
if [[ -n "${CLIENT_CA}" ]]; then
  AUTHN="{anonymous: {enabled: false}, webhook: {enabled: false}, x509: {clientCAFile: ${CLIENT_CA}}}"
else
  tl::warn "no kubelet client CA (-c): the kubelet on ${NODE_IP}:${PORT} admits anonymous clients"
  AUTHN="{anonymous: {enabled: true}, webhook: {enabled: false}}"
fi
cat >"${DIR}/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication: ${AUTHN}
# Whoever holds a certificate of the client CA (the API server) may do anything.
authorization: {mode: AlwaysAllow}
containerRuntimeEndpoint: unix://${TL_CTRD_SOCK}
address: ${NODE_IP}
port: ${PORT}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: ${HEALTHZ_PORT}
# PID 1 is not systemd, and this host mixes cgroup v1 hierarchies with an empty unified one.
cgroupDriver: cgroupfs
failCgroupV1: false
cgroupRoot: ${TL_CTRD_CGROUP}
cgroupsPerQOS: true
enforceNodeAllocatable: []
failSwapOn: false
resolvConf: ""
clusterDomain: cluster.local
# A shared test machine: no evictions and no image garbage collection by disk pressure.
evictionHard: {}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
registerWithTaints:
- {key: ${TAINT_KEY}, value: "true", effect: NoSchedule}
EOF

"${KUBELET}" \
  --config="${DIR}/kubelet.yaml" \
  --kubeconfig="${KUBECONFIG_PATH}" \
  --hostname-override="${NAME}" \
  --node-ip="${NODE_IP}" \
  --root-dir="${DIR}/kubelet" \
  --cert-dir="${DIR}/kubelet/pki" \
  --node-labels="type=real,nvidia.com/gpu.product=${TL_CLUSTER_GPU_TYPE:-H20}" \
  --v="${TL_REALNODE_VERBOSITY:-1}" \
  >"${LOGS}/kubelet.log" 2>&1 &
KUBELET_PID=$!
tl::log "started kubelet for node ${NAME} on ${NODE_IP}:${PORT} (pid ${KUBELET_PID})"

# wait_for WHAT CHECK... - until CHECK succeeds; fail early if the kubelet (or agent) exits.
wait_for() {
  local what="$1" deadline
  shift
  deadline=$((SECONDS + READY_TIMEOUT))
  until "$@" >/dev/null 2>&1; do
    kill -0 "${KUBELET_PID}" 2>/dev/null ||
      { tail -n 30 "${LOGS}/kubelet.log" >&2; tl::die "the kubelet exited"; }
    if [[ -n "${AGENT_PID}" ]] && ! kill -0 "${AGENT_PID}" 2>/dev/null; then
      tail -n 30 "${LOGS}/agent.log" >&2
      tl::die "the tidelease agent exited"
    fi
    ((SECONDS < deadline)) || tl::die "${what} not seen after ${READY_TIMEOUT}s; see ${LOGS}"
    sleep 0.3
  done
}

node_ready() {
  [[ "$(kubectl get node "${NAME}" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')" == True ]]
}

node_offers_gpus() {
  [[ "$(kubectl get node "${NAME}" -o jsonpath='{.status.allocatable.nvidia\.com/gpu}')" == "${GPUS}" ]]
}

# DRA mode: the agent's ResourceSlice lists every GPU, and the kubelet took its DRA plugin.
node_publishes_gpus() {
  local names
  names="$(kubectl get resourceslices.resource.k8s.io "tidelease-${NAME}" \
    -o jsonpath='{.spec.devices[*].name}')" || return 1
  [[ "$(wc -w <<<"${names}")" -eq "${GPUS}" ]] &&
    grep -q "kubelet registered DRA driver" "${LOGS}/agent.log"
}

# seed_tiers - DRA mode with -t: the GpuNode's availability history (as the agent publishes it)
# from which the agent assesses each fake GPU the tier asked: HA never unhealthy, MA 98 %, LA
# 50 % of the time observed. The agent reads it back when it starts and assesses at once (no
# tierAssessedAt).
seed_tiers() {
  local patch
  patch="$("${TL_VENV}/bin/python" - "${FAKE_UUID_PREFIX}" "${TIERS}" <<'PY'
import json
import sys
import time

from nodeagent.main import fake_uuid

prefix, tiers = sys.argv[1], sys.argv[2].split(",")
now = int(time.time()) - 60
healthy = {"MA": 9800, "LA": 5000}  # of 10000 s observed; the rest unhealthy
history = {}
for index, tier in enumerate(tiers):
    if tier in healthy:
        start = now - 10000
        mid = start + healthy[tier]
        history[fake_uuid(index, prefix)] = [[start, mid, 1], [mid, now, 0]]
print(json.dumps({"status": {"availability": history}}))
PY
)"
  printf '{"apiVersion": "tidelease.io/v1alpha1", "kind": "GpuNode", "metadata": {"name": "%s"}, "spec": {}}\n' \
    "${NAME}" | kubectl apply -f - >/dev/null
  kubectl patch gpunodes.tidelease.io "${NAME}" --subresource=status --type=merge -p "${patch}" >/dev/null
  tl::log "GpuNode ${NAME}: availability history for tiers ${TIERS}"
}

# start_cache NS/ACCOUNT - -C: the agent's cache disk (a tmpfs of CACHE_MIB MiB at DIR/cache, this
# namespace's), the account's token for the peers (audience tidelease-peer-cache, bound to this
# Node, as a pod-bound one names its node), and the agent's cache flags in CACHE_FLAGS: half
# the disk as its bound, 4 MiB kept free, served on a free port (the agent's server listens on
# every address and checks every caller), advertised as 127.0.0.1's.
CACHE_FLAGS=() CACHE_PORT=""
start_cache() {
  local account="${1#*/}" namespace="${1%%/*}"
  mkdir -p "${DIR}/cache"
  mount -t tmpfs -o "size=${CACHE_MIB}m,mode=0700" tmpfs "${DIR}/cache"
  (umask 077 && kubectl create token "${account}" -n "${namespace}" --duration=48h \
    --audience tidelease-peer-cache --bound-object-kind Node --bound-object-name "${NAME}" \
    >"${DIR}/peer-token") || tl::die "minting ${1}'s peer-cache token bound to node ${NAME}"
  CACHE_PORT="$(tl::free_port)"
  CACHE_FLAGS=(--namespace "${namespace}" --cache-peer-account "${account}"
    --cache-dir "${DIR}/cache" --cache-port "${CACHE_PORT}"
    --cache-advertise "http://127.0.0.1:${CACHE_PORT}" --cache-token-file "${DIR}/peer-token"
    --cache-max-bytes "$((CACHE_MIB / 2))Mi" --cache-reserve-bytes 4Mi)
  tl::log "the agent's cache: a ${CACHE_MIB} MiB tmpfs at ${DIR}/cache, served on port ${CACHE_PORT}"
}

wait_for "node ${NAME} Ready" node_ready

GATEWAY="${TL_CTRD_SUBNET%.0/24}.1"
if ((GPUS > 0)); then
  # Stand-ins for /dev/nvidiaN (the null device's numbers) that containers get as their GPUs.
  mkdir -p "${DIR}/fakedev/dev"
  for ((i = 0; i < GPUS; i++)); do mknod -m 0666 "${DIR}/fakedev/dev/nvidia${i}" c 1 3; done
fi
if [[ "${AGENT_IN_POD}" == true ]]; then
  # The bridge the CNI plugin would make at the first pod, made now with its gateway address
  # (the plugin keeps both); tl::ctrd::stop removes it.
  ip link add name "${TL_CTRD_BRIDGE}" type bridge
  ip addr add "${GATEWAY}/24" dev "${TL_CTRD_BRIDGE}"
  ip link set "${TL_CTRD_BRIDGE}" up
elif ((GPUS > 0)); then
  kubectl create namespace tidelease-system >/dev/null 2>&1 || true
  agent_flags=(--device-plugin-dir "${DIR}/device-plugins" --fake-uuid-prefix "${FAKE_UUID_PREFIX}")
  if [[ "${DRA}" == true ]]; then
    [[ -z "${TIERS}" ]] || seed_tiers
    agent_flags=(--dra --no-device-plugin --fake-uuid-prefix "${FAKE_UUID_PREFIX}"
      --kubelet-registry-dir "${REGISTRY_DIR}" --kubelet-plugins-dir "${PLUGINS_DIR}"
      --cdi-dir "${CDI_DIR}")
  fi
  agent_kubeconfig="${KUBECONFIG_PATH}"
  if [[ -n "${AGENT_ACCOUNT}" ]]; then
    agent_kubeconfig="${DIR}/agent.kubeconfig"
    tl::account_kubeconfig "${KUBECONFIG_PATH}" "${agent_kubeconfig}" "${AGENT_ACCOUNT}" "${NAME}" ||
      tl::die "minting a token of ${AGENT_ACCOUNT} bound to node ${NAME}"
  fi
  if [[ -n "${CACHE_MIB}" ]]; then
    start_cache "${AGENT_ACCOUNT:-tidelease-system/tidelease-agent}"
    agent_flags+=("${CACHE_FLAGS[@]}")
  fi
  [[ -z "${LAYOUT}" ]] || agent_flags+=(--fake-topology "${LAYOUT}")
  "${TL_VENV}/bin/tidelease" agent --node "${NAME}" --kubeconfig "${agent_kubeconfig}" \
    --backend fake --fake-gpus "${GPUS}" --cycle 1 --quiet-period 3 \
    --host-device-root "${DIR}/fakedev" "${agent_flags[@]}" \
    --cri-endpoint "unix://${TL_CTRD_SOCK}" \
    >"${LOGS}/agent.log" 2>&1 &
  AGENT_PID=$!
  tl::log "started tidelease agent (${MODE} mode) with ${GPUS} fake GPUs (pid ${AGENT_PID})"
  if [[ "${DRA}" == true ]]; then
    wait_for "ResourceSlice tidelease-${NAME} with ${GPUS} devices, DRA plugin registered" \
      node_publishes_gpus
  else
    wait_for "nvidia.com/gpu: ${GPUS} on node ${NAME}" node_offers_gpus
  fi
fi

cat >"${DIR}/realnode.env.tmp" <<EOF
TL_REALNODE_NAME=${NAME}
TL_REALNODE_IP=${NODE_IP}
TL_REALNODE_GPUS=${GPUS}
TL_REALNODE_MODE=${MODE}
TL_REALNODE_CONTAINERD_VERSION=${CTRD_VERSION}
TL_REALNODE_CDI_DIR=${CDI_DIR}
TL_REALNODE_TAINT=${TAINT_KEY}
TL_REALNODE_CTRD_SOCK=${TL_CTRD_SOCK}
TL_REALNODE_CTR=${TL_CTRD_BIN_DIR:+${TL_CTRD_BIN_DIR}/}ctr
TL_REALNODE_SUBNET=${TL_CTRD_SUBNET}
TL_REALNODE_GATEWAY=${GATEWAY}
TL_REALNODE_FAKEDEV=${DIR}/fakedev
TL_REALNODE_LOGS=${LOGS}
TL_REALNODE_PID=$$
TL_REALNODE_KUBELET_PID=${KUBELET_PID}
TL_REALNODE_AGENT_PID=${AGENT_PID}
TL_REALNODE_CACHE_DIR=${CACHE_MIB:+${DIR}/cache}
TL_REALNODE_CACHE_PORT=${CACHE_PORT}
TL_REALNODE_CACHE_TOKEN=${CACHE_MIB:+${DIR}/peer-token}
EOF
mv "${DIR}/realnode.env.tmp" "${DIR}/realnode.env"
tl::log "real node ${NAME} ready"

PARENT="${TL_REALNODE_PARENT_PID:-}"
node_alive() {
  kill -0 "${KUBELET_PID}" 2>/dev/null || tl::die "the kubelet exited; see ${LOGS}/kubelet.log"
  kill -0 "${TL_CTRD_PID}" 2>/dev/null || tl::die "containerd exited; see ${TL_CTRD_LOG}"
}
tl::supervise "${PARENT}" "node ${NAME}" node_alive
