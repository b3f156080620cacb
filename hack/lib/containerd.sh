# shellcheck shell=bash
# A private containerd with its CRI plugin, from Debian's packages: its own root, state, socket,
# runc root, CNI network (a bridge and subnet of its own) and cgroup parent, all derived from one
# directory, so two runs on one machine never collide. Used by hack/containerd.sh (containerd
# alone, for the CRI tests) and hack/realnode.sh (containerd under a real kubelet). Source it
# after common.sh. Facts behind each setting: ../shared notes on containerd and CRI, and
# docs/real-node.md.
#
#   tl::ctrd::ensure_packages      install containerd, runc, CNI plugins, busybox-static if missing
#   tl::ctrd::use_v2               run the built containerd 2.x instead of Debian's (before start)
#   tl::ctrd::init DIR [CDI_DIR]   settings for DIR (TL_CTRD_*), config files written; CDI_DIR:
#                                  where containerd reads CDI specs (CDI on; 1.7 or later only)
#   tl::ctrd::start                start containerd; wait for its socket (TL_CTRD_PID)
#   tl::ctrd::server_version       the running containerd's version (v1.6.20, v2.4.2)
#   tl::ctrd::import_images        build hack/images.py's images and import them
#   tl::ctrd::stop                 stop containerd and remove everything it left (idempotent)

if [[ -n "${TL_CTRD_SOURCED:-}" ]]; then
  return 0
fi
TL_CTRD_SOURCED=1

# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

TL_CTRD_PACKAGES=(containerd runc containernetworking-plugins busybox-static iptables)
# containerd 2.x for the real node's DRA mode (Debian's 1.6 ignores CDI, which DRA needs): built
# from the Go module proxy by hack/build-binaries.sh (wrapper module hack/gomod/containerd, same
# pin) into $(tl::cache_dir)/bin/<version>/. It runs with Debian's runc and CNI plugins.
TL_CONTAINERD_VERSION="${TL_CONTAINERD_VERSION:-v2.4.2}"
TL_CTRD2_COMPONENTS=(containerd containerd-shim-runc-v2 ctr)
TL_CTRD_CNI_BIN_DIR="${TL_CTRD_CNI_BIN_DIR:-/usr/lib/cni}"
TL_CTRD_STOP_TIMEOUT="${TL_CTRD_STOP_TIMEOUT:-15}"
TL_CTRD_PID=""
# Where containerd, containerd-shim-runc-v2 and ctr come from: empty for Debian's (PATH), else
# the directory of the built 2.x ones (tl::ctrd::use_v2).
TL_CTRD_BIN_DIR=""

# tl::ctrd::bin2_path NAME - where the built containerd 2.x binary NAME is cached.
tl::ctrd::bin2_path() {
  printf '%s/bin/%s/%s\n' "$(tl::cache_dir)" "${TL_CONTAINERD_VERSION}" "$1"
}

# tl::ctrd::missing - the packages whose commands are not here (none: empty output).
tl::ctrd::missing() {
  command -v containerd >/dev/null || printf 'containerd\n'
  command -v runc >/dev/null || printf 'runc\n'
  [[ -x "${TL_CTRD_CNI_BIN_DIR}/bridge" ]] || printf 'containernetworking-plugins\n'
  command -v busybox >/dev/null || printf 'busybox-static\n'
}

# tl::ctrd::ensure_packages - Debian's containerd, runc, CNI plugins and a static busybox (for the
# images); installed with apt-get when missing and we are root, else a clear error.
tl::ctrd::ensure_packages() {
  local missing
  missing="$(tl::ctrd::missing)"
  [[ -z "${missing}" ]] && return 0
  if [[ "${EUID}" -ne 0 ]] || ! command -v apt-get >/dev/null; then
    tl::die "missing: ${missing//$'\n'/ } (apt-get install ${TL_CTRD_PACKAGES[*]}, as root)"
  fi
  tl::log "installing ${TL_CTRD_PACKAGES[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${TL_CTRD_PACKAGES[@]}" >&2 ||
    { apt-get update -q >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${TL_CTRD_PACKAGES[@]}" >&2; } ||
    tl::die "apt-get install ${TL_CTRD_PACKAGES[*]} failed"
  missing="$(tl::ctrd::missing)"
  [[ -z "${missing}" ]] || tl::die "still missing after apt-get: ${missing//$'\n'/ }"
}

# tl::ctrd::use_v2 - run the built containerd 2.x (hack/build-binaries.sh) instead of Debian's:
# its containerd and ctr, and its shim first in containerd's PATH (containerd finds its runtime's
# shim binary by name there). Dies, naming the build command, when they are not built.
tl::ctrd::use_v2() {
  local name dir out
  dir="$(dirname "$(tl::ctrd::bin2_path containerd)")"
  for name in "${TL_CTRD2_COMPONENTS[@]}"; do
    [[ -x "${dir}/${name}" ]] ||
      tl::die "containerd ${TL_CONTAINERD_VERSION} not built (${dir}/${name}); run hack/build-binaries.sh ${TL_CTRD2_COMPONENTS[*]}"
  done
  out="$("${dir}/containerd" --version 2>&1)" || tl::die "${dir}/containerd --version fails: ${out}"
  [[ "${out}" == *" v2."* ]] || tl::die "${dir}/containerd is not containerd 2.x: ${out}"
  TL_CTRD_BIN_DIR="${dir}"
}

# tl::ctrd::server_version - the version the running containerd reports (ctr version).
tl::ctrd::server_version() {
  tl::ctrd::ctr version 2>/dev/null | awk '/^Server:/ { s = 1 } s && $1 == "Version:" { print $2; exit }'
}

# tl::ctrd::_id DIR - 8 hex digits derived from DIR: names the bridge, cgroups and subnet.
tl::ctrd::_id() {
  printf '%s' "$1" | sha256sum | cut -c1-8
}

# tl::ctrd::init DIR - the settings of a containerd living in DIR, and its configuration files.
tl::ctrd::init() {
  local dir="$1" cdi_dir="${2:-}" id n
  [[ "${dir}" == /* ]] || tl::die "containerd directory must be absolute: ${dir}"
  id="$(tl::ctrd::_id "${dir}")"
  n=$((16#${id:0:4}))
  TL_CTRD_DIR="${dir}"
  TL_CTRD_SOCK="${dir}/containerd.sock"
  TL_CTRD_BRIDGE="tl${id}"
  TL_CTRD_NET="tidelease-${id}"
  # 10.128.0.0/9 split into /24s by the directory's hash: distinct runs, distinct subnets.
  TL_CTRD_SUBNET="10.$((128 + (n >> 8) % 128)).$((n % 256)).0/24"
  # The cgroup (in every hierarchy) under which this containerd's pods run.
  TL_CTRD_CGROUP="/tidelease-${id}"
  TL_CTRD_LOG="${TL_CTRD_LOG_DIR:-${dir}}/containerd.log"
  mkdir -p "${dir}/root" "${dir}/state" "${dir}/cni/net.d" "${dir}/cni/ipam" "${dir}/runc" "${dir}/images"
  cat >"${dir}/config.toml" <<EOF
version = 2
root = "${dir}/root"
state = "${dir}/state"
[grpc]
  address = "${TL_CTRD_SOCK}"
[ttrpc]
  address = "${TL_CTRD_SOCK}.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "docker.io/local/pause:v1"
  # Root here lacks CAP_SYS_RESOURCE: without this, runc init fails on oom_score_adj.
  restrict_oom_score_adj = true
  disable_apparmor = true
  netns_mounts_under_state_dir = true
$(if [[ -n "${cdi_dir}" ]]; then
    printf '  # CDI: devices the kubelet names (DRA) are edited in from the specs here.\n'
    printf '  enable_cdi = true\n  cdi_spec_dirs = ["%s"]\n' "${cdi_dir}"
  fi)
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "${dir}/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "${TL_CTRD_CNI_BIN_DIR}"
    conf_dir = "${dir}/cni/net.d"
$(if [[ -n "${TL_CTRD_BIN_DIR}" ]]; then
    # 2.x runs NRI by default, on one socket per host (/var/run/nri): none here.
    printf '[plugins."io.containerd.nri.v1.nri"]\n  disable = true\n'
  fi)
EOF
  cat >"${dir}/cni/net.d/10-tidelease.conflist" <<EOF
{"cniVersion": "1.0.0", "name": "${TL_CTRD_NET}", "plugins": [
  {"type": "bridge", "bridge": "${TL_CTRD_BRIDGE}", "isGateway": true, "ipMasq": false,
   "ipam": {"type": "host-local", "dataDir": "${dir}/cni/ipam",
            "ranges": [[{"subnet": "${TL_CTRD_SUBNET}"}]]}},
  {"type": "loopback"}]}
EOF
}

# tl::ctrd::_cgroup_dirs - this containerd's cgroup in every mounted hierarchy.
tl::ctrd::_cgroup_dirs() {
  local base
  for base in /sys/fs/cgroup/*/ /sys/fs/cgroup/; do
    [[ -e "${base}cgroup.procs" ]] || continue
    printf '%s\n' "${base%/}${TL_CTRD_CGROUP}"
  done | sort -u
}

# tl::ctrd::make_cgroups - create TL_CTRD_CGROUP in every hierarchy (a kubelet insists that its
# cgroup root exists in all of them); cpuset needs its cpus and mems filled in before use.
tl::ctrd::make_cgroups() {
  local d parent
  while read -r d; do
    mkdir -p "${d}"
    if [[ -e "${d}/cpuset.cpus" && -z "$(cat "${d}/cpuset.cpus")" ]]; then
      parent="$(dirname "${d}")"
      cat "${parent}/cpuset.cpus" >"${d}/cpuset.cpus"
      cat "${parent}/cpuset.mems" >"${d}/cpuset.mems"
    fi
  done < <(tl::ctrd::_cgroup_dirs)
}

tl::ctrd::ctr() {
  "${TL_CTRD_BIN_DIR:+${TL_CTRD_BIN_DIR}/}ctr" --address "${TL_CTRD_SOCK}" --namespace k8s.io "$@"
}

# tl::ctrd::start - start containerd (output in TL_CTRD_LOG) and wait until it answers.
tl::ctrd::start() {
  local deadline
  tl::ctrd::make_cgroups
  PATH="${TL_CTRD_BIN_DIR:+${TL_CTRD_BIN_DIR}:}${PATH}" \
    "${TL_CTRD_BIN_DIR:+${TL_CTRD_BIN_DIR}/}containerd" --config "${TL_CTRD_DIR}/config.toml" \
    >"${TL_CTRD_LOG}" 2>&1 &
  TL_CTRD_PID=$!
  deadline=$((SECONDS + 30))
  until tl::ctrd::ctr version >/dev/null 2>&1; do
    kill -0 "${TL_CTRD_PID}" 2>/dev/null || { tail -n 30 "${TL_CTRD_LOG}" >&2; tl::die "containerd exited"; }
    ((SECONDS < deadline)) || { tail -n 30 "${TL_CTRD_LOG}" >&2; tl::die "containerd not answering on ${TL_CTRD_SOCK}"; }
    sleep 0.1
  done
  tl::log "containerd $(tl::ctrd::server_version) answering on ${TL_CTRD_SOCK} (pid ${TL_CTRD_PID})"
}

# tl::ctrd::import_images [NAME...] - hack/images.py's images, imported into the k8s.io namespace.
tl::ctrd::import_images() {
  local tarball
  while read -r tarball; do
    tl::ctrd::ctr images import --snapshotter overlayfs "${tarball}" >/dev/null ||
      tl::die "importing ${tarball} failed"
  done < <(python3 "${TL_HACK}/images.py" "${TL_CTRD_DIR}/images" "$@")
  tl::log "imported images: $(tl::ctrd::ctr images ls -q | grep -c '^docker.io/local/')"
}

# tl::ctrd::_kill_tasks - every container task still running under this containerd, killed.
tl::ctrd::_kill_tasks() {
  local task
  for task in $(tl::ctrd::ctr tasks ls -q 2>/dev/null); do
    tl::ctrd::ctr tasks kill --signal SIGKILL "${task}" >/dev/null 2>&1 || true
  done
}

# tl::ctrd::stop - stop containerd, then remove what it leaves behind even when it was killed:
# shims and their containers, mounts under the directory, the bridge, the cgroups. Idempotent.
tl::ctrd::stop() {
  local pid deadline d
  [[ -n "${TL_CTRD_DIR:-}" ]] || return 0
  if [[ -n "${TL_CTRD_PID}" ]] && kill -0 "${TL_CTRD_PID}" 2>/dev/null; then
    tl::ctrd::_kill_tasks
    kill -TERM "${TL_CTRD_PID}" 2>/dev/null || true
    deadline=$((SECONDS + TL_CTRD_STOP_TIMEOUT))
    while kill -0 "${TL_CTRD_PID}" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.1; done
    kill -KILL "${TL_CTRD_PID}" 2>/dev/null || true
  fi
  TL_CTRD_PID=""
  # Shims (and the containers they hold) outlive containerd: they name our socket.
  for pid in $(pgrep -f -- "-address ${TL_CTRD_SOCK}" || true); do
    pkill -KILL -P "${pid}" 2>/dev/null || true
    kill -KILL "${pid}" 2>/dev/null || true
  done
  # Anything still in our cgroups (containers whose shim is gone).
  while read -r d; do
    [[ -d "${d}" ]] || continue
    find "${d}" -name cgroup.procs -exec cat {} + 2>/dev/null | xargs -r kill -KILL 2>/dev/null || true
  done < <(tl::ctrd::_cgroup_dirs)
  # Mounts under the directory (rootfs overlays, netns files, shm).
  tl::umount_under "${TL_CTRD_DIR}"
  ip link delete "${TL_CTRD_BRIDGE}" >/dev/null 2>&1 || true
  sleep 0.2
  while read -r d; do
    [[ -d "${d}" ]] && find "${d}" -depth -type d -exec rmdir {} + 2>/dev/null || true
  done < <(tl::ctrd::_cgroup_dirs)
}
