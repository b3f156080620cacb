# shellcheck shell=bash
# Shared helpers for hack/ scripts. Source it; do not execute it.
#
#   source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
#
# Everything here is prefixed `tl::` (functions) or is a pinned version (variables).

if [[ -n "${TL_COMMON_SOURCED:-}" ]]; then
  return 0
fi
TL_COMMON_SOURCED=1

# Root of the checkout, derived from this file's location (never hard-coded).
TL_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd -P)"
# shellcheck disable=SC2034 # used by the scripts that source this file
TL_HACK="${TL_ROOT}/hack"

# ---------------------------------------------------------------------------------------------
# Pinned upstream versions. The wrapper modules under hack/gomod/ pin the same versions; after
# changing one here, run hack/update-gomod.sh and commit the go.mod/go.sum it writes.
#
# KUBE_VERSION: the newest minor that runs on our hosts. They are cgroup v1 (hybrid) with
# Debian 12's containerd 1.6: 1.35 is the last release that supports containerd 1.x (1.36 needs
# containerd 2), and its kubelet runs on cgroup v1 only with `failCgroupV1: false` in its
# KubeletConfiguration (hack/realnode.sh sets it). Every staging module it replaces is served
# at v0.35.4 by the module proxy.
# ---------------------------------------------------------------------------------------------
KUBE_VERSION="${KUBE_VERSION:-v1.35.4}"
ETCD_VERSION="${ETCD_VERSION:-v3.5.21}"
KWOK_VERSION="${KWOK_VERSION:-v0.7.0}"
# Helm renders and installs the chart (manifests/charts/tidelease); helm lint/template run in the
# test command and the e2e suite installs the chart with it.
HELM_VERSION="${HELM_VERSION:-v3.22.0}"
# promtool checks and unit-tests the chart's alerting rules (manifests/charts/tidelease/monitoring)
# in the test command. Prometheus 3.x publishes its Go module as v0.3MM.P for release 3.MM.P;
# this is the module version (v0.316.0 is Prometheus 3.16.0, which promtool reports).
PROMETHEUS_VERSION="${PROMETHEUS_VERSION:-v0.316.0}"
# Kueue's controller manager (cmd/kueue) and its CRDs, for the Kueue integration's tests (issue 37):
# started by the cluster scripts only when a test asks for it (TL_CLUSTER_KUEUE=true).
KUEUE_VERSION="${KUEUE_VERSION:-v0.17.0}"
# The NVIDIA GPU Operator's source (its Helm chart, deployments/gpu-operator), for the test of
# the recipe beside it (docs/gpu-operator.md): rendered, never run (its components need GPUs).
# The module has no release tags the Go proxy serves: a commit of its main branch.
GPU_OPERATOR_VERSION="${GPU_OPERATOR_VERSION:-v0.0.0-20250917190837-d73a0086a6ba}"

# Components that hack/build-binaries.sh knows, in build priority order.
TL_COMPONENTS=(
  etcd kube-apiserver kubectl kube-scheduler kube-controller-manager kubelet kwok helm promtool
  kueue
)

# ---------------------------------------------------------------------------------------------
# Logging (stderr, timestamped).
# ---------------------------------------------------------------------------------------------
tl::log() {
  printf '%s [%s] %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "${TL_LOG_NAME:-$(basename "$0")}" "$*" >&2
}

tl::warn() {
  tl::log "WARNING: $*"
}

tl::die() {
  tl::log "ERROR: $*"
  exit 1
}

# tl::require_cmd CMD... - fail early when a command is missing.
tl::require_cmd() {
  local cmd
  for cmd in "$@"; do
    command -v "${cmd}" >/dev/null 2>&1 || tl::die "required command not found: ${cmd}"
  done
}

# ---------------------------------------------------------------------------------------------
# Cache layout (outside the checkout).
# ---------------------------------------------------------------------------------------------
tl::cache_dir() {
  printf '%s\n' "${TIDELEASE_CACHE_DIR:-${XDG_CACHE_HOME:-${HOME}/.cache}/tidelease}"
}

# tl::component_version NAME - the upstream version a component is built at.
tl::component_version() {
  case "$1" in
    etcd) printf '%s\n' "${ETCD_VERSION}" ;;
    kwok) printf '%s\n' "${KWOK_VERSION}" ;;
    helm) printf '%s\n' "${HELM_VERSION}" ;;
    promtool) printf '%s\n' "${PROMETHEUS_VERSION}" ;;
    kueue) printf '%s\n' "${KUEUE_VERSION}" ;;
    kube-apiserver | kubectl | kube-scheduler | kube-controller-manager | kubelet)
      printf '%s\n' "${KUBE_VERSION}"
      ;;
    *) tl::die "unknown component: $1 (known: ${TL_COMPONENTS[*]})" ;;
  esac
}

# The Helm chart: the one source of what an admin installs (manifests/charts/tidelease). The local
# cluster takes its CRDs, PriorityClasses and scheduler configuration from it too.
TL_CHART="${TL_ROOT}/manifests/charts/tidelease"

# tl::chart::render [HELM TEMPLATE ARGS...] - the chart rendered as release `tidelease` in
# tidelease-system, for the Kubernetes version the binaries are built at.
tl::chart::render() {
  "$(tl::bin helm)" template tidelease "${TL_CHART}" --namespace tidelease-system \
    --kube-version "${KUBE_VERSION}" "$@"
}

# tl::account_kubeconfig SRC DST NAMESPACE/ACCOUNT [NODE] - DST (mode 0600): the kubeconfig SRC
# (its server and CA) with a token of the ServiceAccount ACCOUNT for its credentials, minted with
# SRC's (`kubectl create token`, 48 hours), bound to the Node NODE when given: as the kubelet's
# tokens for the chart's agent pods name their node (user extra
# authentication.kubernetes.io/node-name, which the agent's admission policy compares).
tl::account_kubeconfig() {
  local src="$1" dst="$2" account="${3#*/}" namespace="${3%%/*}" node="${4:-}" kubectl token user
  kubectl="$(tl::bin kubectl)"
  token="$("${kubectl}" --kubeconfig "${src}" create token "${account}" -n "${namespace}" \
    --duration=48h ${node:+--bound-object-kind Node --bound-object-name "${node}"})" || return 1
  (umask 077 && "${kubectl}" --kubeconfig "${src}" config view --raw --minify --flatten >"${dst}")
  user="$("${kubectl}" --kubeconfig "${dst}" config view -o jsonpath='{.contexts[0].context.user}')"
  "${kubectl}" --kubeconfig "${dst}" config unset "users.${user}" >/dev/null
  "${kubectl}" --kubeconfig "${dst}" config set-credentials "${user}" --token="${token}" >/dev/null
}

# tl::bin_path NAME - where the cached binary for NAME lives: $(cache)/bin/<version>/<name>.
tl::bin_path() {
  local version
  version="$(tl::component_version "$1")" || return 1
  printf '%s/bin/%s/%s\n' "$(tl::cache_dir)" "${version}" "$1"
}

# tl::bin NAME - path of a cached binary; fails with a hint when it has not been built.
tl::bin() {
  local path
  path="$(tl::bin_path "$1")" || return 1
  [[ -x "${path}" ]] || tl::die "$1 not built (${path}); run hack/build-binaries.sh $1"
  printf '%s\n' "${path}"
}

# ---------------------------------------------------------------------------------------------
# Misc.
# ---------------------------------------------------------------------------------------------

# tl::free_port - print a TCP port on 127.0.0.1 that is free right now.
tl::free_port() {
  local python
  python="$(command -v python3 || command -v python || true)"
  if [[ -n "${python}" ]]; then
    "${python}" -c 'import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])
s.close()'
    return
  fi
  # Fallback without Python: probe random high ports.
  local port _
  for _ in $(seq 1 100); do
    port=$((20000 + RANDOM % 40000))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/${port}") 2>/dev/null; then
      printf '%s\n' "${port}"
      return
    fi
  done
  tl::die "no free port found"
}

# tl::umount_under DIR - lazily unmount every mount point under DIR (innermost first).
tl::umount_under() {
  local mnt
  while read -r mnt; do
    umount -l "${mnt}" 2>/dev/null || true
  done < <(awk -v d="${1%/}/" 'index($5, d) == 1 || $5 == substr(d, 1, length(d) - 1) { print $5 }' \
    /proc/self/mountinfo | sort -r)
}

# tl::supervise PARENT_PID WHAT [CHECK...] - return once PARENT_PID is gone (never when empty),
# saying that WHAT stops; run the command CHECK every second meanwhile (it may tl::die or warn
# about a component). Sleeps in the background, so that the caller's traps run at once on a
# signal; leaves no sleeping child behind for longer than a second.
tl::supervise() {
  local parent="$1" what="$2"
  shift 2
  while true; do
    sleep 1 &
    wait $! || true
    if [[ -n "${parent}" ]] && ! kill -0 "${parent}" 2>/dev/null; then
      tl::log "parent process ${parent} is gone; stopping ${what}"
      return 0
    fi
    if (($#)); then "$@"; fi
  done
}

# tl::module_dir MODULE VERSION SUBDIR - the directory of a Go module's source at VERSION (in the
# module cache; downloaded from the proxy when missing), which must hold SUBDIR: the pinned
# modules' own manifests (Kueue's CRDs, kwok's pod stages), read where they are, never copied.
tl::module_dir() {
  local dir
  dir="$(cd "${TMPDIR:-/tmp}" && GOFLAGS= go mod download -json "$1@$2" |
    sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')"
  [[ -n "${dir}" && -d "${dir}/$3" ]] || tl::die "cannot find $3 in $1 $2 (go mod download $1@$2)"
  printf '%s\n' "${dir}"
}

# tl::now_s - seconds since the epoch with a fractional part (for timings).
tl::now_s() {
  date +%s.%N
}

# tl::elapsed START - seconds since START (from tl::now_s), one decimal.
tl::elapsed() {
  awk -v s="$1" -v e="$(tl::now_s)" 'BEGIN { printf "%.1f", e - s }'
}
