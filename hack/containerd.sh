#!/usr/bin/env bash
# Run a private containerd (Debian's, with its CRI plugin) in DIR, with tidelease's test images
# imported, until SIGINT/SIGTERM or until TL_CTRD_PARENT_PID exits; then stop it and remove
# everything it left behind (containers, mounts, bridge, cgroups, DIR itself).
#
# usage: hack/containerd.sh -D DIR
#
# When ready it writes DIR/containerd.env (KEY=VALUE lines; `source` it): TL_CTRD_SOCK (the CRI
# socket), TL_CTRD_CGROUP (a cgroup to put pod sandboxes under), TL_CTRD_SUBNET, TL_CTRD_PID,
# TL_CTRD_IMAGES (space-separated image names). Installs the Debian packages when they are
# missing (as root). Settings: hack/lib/containerd.sh.
set -o errexit -o nounset -o pipefail

source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
source "${TL_HACK}/lib/containerd.sh"

usage() { sed -n '2,11p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }

DIR=""
while getopts ":D:h" opt; do
  case "${opt}" in
    D) DIR="$(realpath -m -- "${OPTARG}")" ;;
    h) usage; exit 0 ;;
    *) usage >&2; exit 2 ;;
  esac
done
[[ -n "${DIR}" ]] || { usage >&2; exit 2; }
PARENT="${TL_CTRD_PARENT_PID:-}"

cleanup() {
  local rc=$?
  trap - EXIT
  trap '' INT TERM HUP
  tl::ctrd::stop
  rm -rf -- "${DIR}"
  exit "${rc}"
}

tl::ctrd::ensure_packages
# DIR is removed at the end: it must be new (or empty).
[[ ! -e "${DIR}" || -z "$(ls -A "${DIR}")" ]] || tl::die "${DIR} must be absent or empty"
tl::ctrd::init "${DIR}"
trap cleanup EXIT
trap 'exit 0' INT TERM HUP
tl::ctrd::start
tl::ctrd::import_images
images="$(tl::ctrd::ctr images ls -q | grep '^docker.io/local/' | tr '\n' ' ')"
cat >"${DIR}/containerd.env.tmp" <<EOF
TL_CTRD_DIR=${DIR}
TL_CTRD_SOCK=${TL_CTRD_SOCK}
TL_CTRD_CGROUP=${TL_CTRD_CGROUP}
TL_CTRD_SUBNET=${TL_CTRD_SUBNET}
TL_CTRD_PID=${TL_CTRD_PID}
TL_CTRD_LOG=${TL_CTRD_LOG}
TL_CTRD_IMAGES=${images% }
EOF
mv "${DIR}/containerd.env.tmp" "${DIR}/containerd.env"
tl::log "containerd ready in ${DIR}"

containerd_alive() {
  kill -0 "${TL_CTRD_PID}" 2>/dev/null || tl::die "containerd exited; see ${TL_CTRD_LOG}"
}
tl::supervise "${PARENT}" containerd containerd_alive
