#!/usr/bin/env bash
# Build tidelease's container images here, without a registry, as docker-archive tarballs (what
# `ctr -n k8s.io images import` and `docker load` take); print the archive's path.
#
# usage: hack/build-image.sh [-o OUT] [--import SOCKET] [--rebuild [--same-inputs]]
#                             [tidelease | kube-scheduler]
#   tidelease        (default) Debian bookworm made with mmdebstrap from Debian's packages, its
#                    python3, and tidelease with its runtime dependencies installed from wheels
#                    into /opt/tidelease; tags tidelease:<version> and
#                    tidelease:<version>-<commit>[-dirty]. Needs root (mmdebstrap, chroot).
#   kube-scheduler   the kube-scheduler of hack/build-binaries.sh alone, one layer; tag
#                    tidelease.local/kube-scheduler:${KUBE_VERSION}
#   -o OUT           also copy the archive to OUT
#   --import SOCKET  import it into the containerd at SOCKET (namespace k8s.io)
#   --rebuild        build even when the cache has the archive (and replace it there)
#   --same-inputs    (tidelease) from the Debian packages and dependency wheels of the last
#                    build, kept in the cache, not from the package sources: what was
#                    published since (a Debian stable update, a new wheel) stays out
#
# Both run as the non-root user 65532. Reproducible: every mtime is the last commit's time
# (SOURCE_DATE_EPOCH), tar entries are sorted, and the same commit, Debian packages and wheels
# give the same image id. Archives are cached by their inputs in $(tl::cache_dir)/images, so a
# second run returns at once. Installs mmdebstrap with apt-get when it is missing. Details:
# docs/image.md; the same image built with ordinary tools: Containerfile.
set -o errexit -o nounset -o pipefail

source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"

usage() { sed -n '2,24p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }

# What goes into the tidelease image. The Containerfile says the same (checked by
# tests/unit/test_image_recipe.py): keep them in step.
TL_IMAGE_SUITE=bookworm
# Where the Debian packages come from: TL_IMAGE_MIRROR (a URL, or a sources file), else the
# host's own apt sources, the ones `apt-get` uses here.
TL_IMAGE_MIRROR="${TL_IMAGE_MIRROR:-}"
TL_IMAGE_PACKAGES=(python3 ca-certificates libstdc++6)
TL_IMAGE_UID=65532
TL_IMAGE_USER=tidelease
TL_IMAGE_VENV=/opt/tidelease
TL_IMAGE_ENTRYPOINT=/opt/tidelease/bin/tidelease
TL_IMAGE_REQUIREMENT=tidelease # no extras: neither dev (tests, linters) nor plots (matplotlib)
TL_IMAGE_ENV=(
  "PATH=${TL_IMAGE_VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
  "LANG=C.UTF-8"
  "PYTHONDONTWRITEBYTECODE=1"
  "PYTHONUNBUFFERED=1"
)
# The image's Python (Debian bookworm's python3) and the wheels that run on it: glibc 2.36.
TL_IMAGE_PY_VERSION=3.11
TL_IMAGE_GLIBC_MINOR=36
# Documentation the base leaves out (dpkg path filters); each package's copyright file stays.
TL_IMAGE_DPKG_FILTERS=(
  'path-exclude=/usr/share/doc/*'
  'path-include=/usr/share/doc/*/copyright'
  'path-exclude=/usr/share/man/*'
  'path-exclude=/usr/share/info/*'
  'path-exclude=/usr/share/locale/*'
  'path-include=/usr/share/locale/locale.alias'
  'path-exclude=/usr/share/lintian/*'
)
TL_IMAGE_DESCRIPTION="Elastic GPU leasing with right of return: kube-scheduler extender and node"
TL_IMAGE_DESCRIPTION+=" agent"

TL_IMAGE_SELF="$(realpath "${BASH_SOURCE[0]}")"
TL_IMAGE_CACHE="$(tl::cache_dir)/images"

# ---------------------------------------------------------------------------------------------
# Inside mmdebstrap's customize hook (this script again: `--customize ROOT`): the user, the
# virtualenv and its byte code, checks. Everything in the chroot runs with a clean environment.
# ---------------------------------------------------------------------------------------------

# in_root ROOT CMD... - CMD in the chroot, with a fixed environment and hash seed.
in_root() {
  local root="$1"
  shift
  chroot "${root}" env -i PATH=/usr/bin:/bin HOME=/root LANG=C.UTF-8 PYTHONHASHSEED=0 \
    SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH}" "$@"
}

# keep_debs ROOT - the .deb files this build installed, kept for the next build (only those).
keep_debs() {
  local root="$1" deb installed fresh="${TL_IMAGE_DEBS}.new"
  # shellcheck disable=SC2016 # dpkg's format fields
  installed="$(in_root "${root}" dpkg-query -W -f '${Package} ${Version}\n')"
  rm -rf "${fresh}"
  mkdir -p "${fresh}"
  for deb in "${root}"/var/cache/apt/archives/*.deb; do
    [[ -e "${deb}" ]] || continue
    # shellcheck disable=SC2016 # dpkg's format fields
    if grep -qxF "$(dpkg-deb --show --showformat '${Package} ${Version}' "${deb}")" \
      <<<"${installed}"; then
      cp -p "${deb}" "${fresh}/"
    fi
  done
  rm -rf "${TL_IMAGE_DEBS}"
  mv "${fresh}" "${TL_IMAGE_DEBS}"
}

customize() {
  local root="$1" pyver site pip
  local -a py=(env PYTHONDONTWRITEBYTECODE=1)
  keep_debs "${root}"

  # The user: 65532, no login, a home of its own.
  printf '%s:x:%s:%s:%s:/home/%s:/usr/sbin/nologin\n' "${TL_IMAGE_USER}" "${TL_IMAGE_UID}" \
    "${TL_IMAGE_UID}" "${TL_IMAGE_USER}" "${TL_IMAGE_USER}" >>"${root}/etc/passwd"
  printf '%s:x:%s:\n' "${TL_IMAGE_USER}" "${TL_IMAGE_UID}" >>"${root}/etc/group"
  printf '%s:!::0:99999:7:::\n' "${TL_IMAGE_USER}" >>"${root}/etc/shadow"
  printf '%s:!::\n' "${TL_IMAGE_USER}" >>"${root}/etc/gshadow"
  install -d -m 0750 -o "${TL_IMAGE_UID}" -g "${TL_IMAGE_UID}" "${root}/home/${TL_IMAGE_USER}"

  # The virtualenv, from the wheels alone. pip runs from its wheel, so that it is not installed.
  pyver="$(in_root "${root}" python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
  [[ "${pyver}" == "${TL_IMAGE_PY_VERSION}" ]] ||
    tl::die "the image's python3 is ${pyver}, the wheels are for ${TL_IMAGE_PY_VERSION}"
  site="${TL_IMAGE_VENV}/lib/python${pyver}/site-packages"
  cp -a "${TL_IMAGE_WHEELS}" "${root}/tmp/wheels"
  pip="/tmp/wheels/$(basename "${TL_IMAGE_PIP_WHEEL}")/pip"
  in_root "${root}" "${py[@]}" python3 -m venv --without-pip "${TL_IMAGE_VENV}"
  in_root "${root}" "${py[@]}" "${TL_IMAGE_VENV}/bin/python" "${pip}" install --quiet \
    --disable-pip-version-check --no-cache-dir --no-index --no-compile --find-links /tmp/wheels \
    "${TL_IMAGE_REQUIREMENT}" >&2
  rm -rf "${root}/tmp/wheels"
  # numpy's and scipy's own test suites (25 MiB); numpy.testing stays.
  find "${root}${site}/numpy" "${root}${site}/scipy" -depth -type d -name tests -exec rm -rf {} +

  # Byte code for the standard library and the virtualenv, made reproducibly: one process, a
  # fixed hash seed, hash-based .pyc (no source mtimes in them).
  find "${root}/usr/lib/python3" "${root}/usr/lib/python${pyver}" "${root}${TL_IMAGE_VENV}" \
    -depth -type d -name __pycache__ -exec rm -rf {} +
  in_root "${root}" python3 -m compileall -q -q -f --invalidation-mode checked-hash \
    "/usr/lib/python3" "/usr/lib/python${pyver}" "${site}" >&2 ||
    tl::die "compileall failed in the image"

  # It runs, and every extension module of the wheels finds the libraries it links to (those
  # the wheels bundle in *.libs/ are found through the modules' RPATH: not checked alone).
  in_root "${root}" "${py[@]}" "${TL_IMAGE_ENTRYPOINT}" --help >/dev/null ||
    tl::die "tidelease --help failed in the image"
  in_root "${root}" "${py[@]}" "${TL_IMAGE_VENV}/bin/python" -c '
import aiohttp, grpc, kubernetes_asyncio, numpy, prometheus_client, pynvml, scipy.optimize, yaml
import extender.main, nodeagent.main' || tl::die "importing the runtime modules failed in the image"
  if in_root "${root}" sh -c "find '${TL_IMAGE_VENV}' -name '*.so' -type f -not -path '*.libs/*' \
      -exec ldd {} + 2>&1" | grep 'not found' >&2; then
    tl::die "shared libraries missing in the image (add their Debian packages to TL_IMAGE_PACKAGES)"
  fi
}

if [[ "${1:-}" == "--customize" ]]; then
  customize "$2"
  exit 0
fi

# ---------------------------------------------------------------------------------------------
# The build.
# ---------------------------------------------------------------------------------------------
IMAGE=tidelease
OUT=""
IMPORT=""
REBUILD=0
SAME_INPUTS=0
while (($#)); do
  case "$1" in
    -o) OUT="$(realpath -m -- "${2:?-o needs a path}")"; shift 2 ;;
    --import) IMPORT="${2:?--import needs a socket}"; shift 2 ;;
    --rebuild) REBUILD=1; shift ;;
    --same-inputs) SAME_INPUTS=1; shift ;;
    -h | --help) usage; exit 0 ;;
    tidelease | kube-scheduler) IMAGE="$1"; shift ;;
    *) usage >&2; exit 2 ;;
  esac
done
((SAME_INPUTS == 0 || REBUILD == 1)) || tl::die "--same-inputs goes with --rebuild"
[[ -z "${IMPORT}" ]] || [[ -S "${IMPORT}" ]] || tl::die "not a socket: ${IMPORT}"
[[ -z "${IMPORT}" ]] || tl::require_cmd ctr
tl::require_cmd git python3 sha256sum flock
mkdir -p "${TL_IMAGE_CACHE}"

WORK=""
cleanup() {
  local rc=$?
  trap - EXIT
  if [[ -n "${WORK}" && -d "${WORK}" ]]; then
    tl::umount_under "${WORK}" # left by an interrupted mmdebstrap
    rm -rf --one-file-system -- "${WORK}"
  fi
  exit "${rc}"
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

# One build at a time per cache (parallel test runs share it).
exec {lock_fd}>"${TL_IMAGE_CACHE}/.lock"
flock "${lock_fd}"

# deliver ARCHIVE - copy it to OUT, import it, print where it is.
deliver() {
  local archive="$1" path="$1"
  if [[ -n "${OUT}" ]]; then
    mkdir -p "$(dirname "${OUT}")"
    cp -- "${archive}" "${OUT}.tmp"
    mv -- "${OUT}.tmp" "${OUT}"
    path="${OUT}"
  fi
  if [[ -n "${IMPORT}" ]]; then
    ctr --address "${IMPORT}" --namespace k8s.io images import "${archive}" >&2 ||
      tl::die "importing ${archive} into ${IMPORT} failed"
  fi
  printf '%s\n' "${path}"
}

# cached ARCHIVE - true (and delivered) when the cache has it and no rebuild was asked for.
cached() {
  if ((REBUILD == 0)) && [[ -s "$1" ]]; then
    tl::log "cached: $1"
    deliver "$1"
    return 0
  fi
  return 1
}

# prune IMAGE - the cache keeps the newest three archives of IMAGE (one per commit, binary or
# state of a dirty tree: they pile up while one edits).
prune() {
  find "${TL_IMAGE_CACHE}" -maxdepth 1 -name "$1-*.tar" -printf '%T@ %p\n' |
    sort -rn | tail -n +4 | cut -d' ' -f2- | xargs -r rm -f --
}

# pack OUT EPOCH ARGS... - hack/images.py pack, the image id in WORK/id.
pack() {
  python3 "${TL_HACK}/images.py" pack --out "$1" --mtime "$2" --gzip "${@:3}" >"${WORK}/id"
}

build_kube_scheduler() {
  local bin sum archive root start
  bin="$(tl::bin kube-scheduler)"
  # Named by the binary and this recipe.
  sum="$(sha256sum "${bin}" "${TL_IMAGE_SELF}" "${TL_HACK}/images.py" | cut -d' ' -f1 | sha256sum |
    cut -c1-12)"
  archive="${TL_IMAGE_CACHE}/kube-scheduler-${KUBE_VERSION}-${sum}.tar"
  cached "${archive}" && return 0
  start="$(tl::now_s)"
  WORK="$(mktemp -d "${TL_IMAGE_CACHE}/work.XXXXXX")"
  root="${WORK}/root"
  install -d -m 0755 "${root}/etc" "${root}/usr/local/bin"
  install -d -m 1777 "${root}/tmp"
  install -m 0755 "${bin}" "${root}/usr/local/bin/kube-scheduler"
  printf 'root:x:0:0:root:/root:/sbin/nologin\n%s:x:%s:%s:%s:/:/sbin/nologin\n' \
    "${TL_IMAGE_USER}" "${TL_IMAGE_UID}" "${TL_IMAGE_UID}" "${TL_IMAGE_USER}" >"${root}/etc/passwd"
  printf 'root:x:0:\n%s:x:%s:\n' "${TL_IMAGE_USER}" "${TL_IMAGE_UID}" >"${root}/etc/group"
  chmod 0644 "${root}/etc/passwd" "${root}/etc/group"
  # The binary alone decides the image: fixed times (the epoch), so the same binary, same id.
  pack "${WORK}/image.tar" 0 \
    --tag "tidelease.local/kube-scheduler:${KUBE_VERSION}" \
    --layer "${root}=kube-scheduler ${KUBE_VERSION} (hack/build-binaries.sh)" \
    --user "${TL_IMAGE_UID}:${TL_IMAGE_UID}" \
    --entrypoint '["/usr/local/bin/kube-scheduler"]' \
    --env "PATH=/usr/local/bin" \
    --label "org.opencontainers.image.title=kube-scheduler" \
    --label "org.opencontainers.image.version=${KUBE_VERSION}" \
    --label "org.opencontainers.image.source=https://github.com/kubernetes/kubernetes" \
    --label "org.opencontainers.image.licenses=Apache-2.0"
  mv -- "${WORK}/image.tar" "${archive}"
  prune kube-scheduler
  tl::log "built ${archive} ($(cat "${WORK}/id")) in $(tl::elapsed "${start}") s"
  deliver "${archive}"
}

# existing_files - the paths read on stdin that are files (a deleted tracked file is not).
existing_files() {
  local f
  while IFS= read -r -d '' f; do
    if [[ -f "${f}" ]]; then printf '%s\0' "${f}"; fi
  done
}

# sources - the files the wheel is built from, NUL-separated, relative to TL_ROOT.
sources() {
  (cd "${TL_ROOT}" && git ls-files -z -co --exclude-standard -- pyproject.toml README.md common \
    extender nodeagent | existing_files)
}

# inputs_hash - a hash of what the image is made of: the sources and this recipe.
inputs_hash() {
  (cd "${TL_ROOT}" && { sources && printf '%s\0' hack/build-image.sh hack/images.py; } |
    sort -z | xargs -0 sha256sum | sha256sum | cut -c1-12)
}

# platforms - pip's --platform options for manylinux wheels that run on the image's glibc.
platforms() {
  local minor
  for ((minor = TL_IMAGE_GLIBC_MINOR; minor >= 5; minor--)); do
    printf -- '--platform\nmanylinux_2_%s_x86_64\n' "${minor}"
  done
  printf -- '--platform\nmanylinux2014_x86_64\n'
}

ensure_mmdebstrap() {
  command -v mmdebstrap >/dev/null && return 0
  command -v apt-get >/dev/null || tl::die "mmdebstrap is missing (Debian's package mmdebstrap)"
  tl::log "installing mmdebstrap"
  local -a install=(apt-get install -y -q -o DPkg::Lock::Timeout=300 mmdebstrap)
  {
    DEBIAN_FRONTEND=noninteractive "${install[@]}" ||
      { apt-get update -q && DEBIAN_FRONTEND=noninteractive "${install[@]}"; }
  } >&2 || tl::die "apt-get install mmdebstrap failed"
}

# make_wheels VERSION - in TL_IMAGE_WHEELS: the wheel of this tree (built from a copy, as pip
# writes build files next to the sources), every runtime dependency as a wheel for the image's
# Python, and pip's own wheel (TL_IMAGE_PIP_WHEEL) to install them with.
make_wheels() {
  local version="$1" src="${WORK}/src" start
  local -a pip=("${TL_PY}" -m pip --disable-pip-version-check) platform_args
  start="$(tl::now_s)"
  mkdir -p "${src}" "${TL_IMAGE_WHEELS}"
  sources | (cd "${TL_ROOT}" && xargs -0 cp --parents -t "${src}")
  "${pip[@]}" wheel --quiet --no-deps --wheel-dir "${TL_IMAGE_WHEELS}" "${src}" >&2
  mapfile -t platform_args < <(platforms)
  # With --same-inputs, the dependencies' wheels (and pip's) of the last build, nothing else.
  local -a index=()
  if ((SAME_INPUTS)); then
    compgen -G "${TL_IMAGE_DEP_WHEELS}/*.whl" >/dev/null ||
      tl::die "--same-inputs: no wheels of an earlier build in ${TL_IMAGE_DEP_WHEELS}"
    index=(--no-index --find-links "${TL_IMAGE_DEP_WHEELS}")
  fi
  "${pip[@]}" download --quiet --only-binary=:all: --implementation cp \
    --python-version "${TL_IMAGE_PY_VERSION}" --abi "cp${TL_IMAGE_PY_VERSION/./}" \
    "${platform_args[@]}" "${index[@]}" --dest "${TL_IMAGE_WHEELS}" \
    "${TL_IMAGE_WHEELS}/tidelease-${version}-py3-none-any.whl" >&2
  "${pip[@]}" download --quiet --only-binary=:all: --no-deps "${index[@]}" \
    --dest "${WORK}/pip" pip >&2
  TL_IMAGE_PIP_WHEEL="$(ls "${WORK}"/pip/pip-*.whl)"
  cp "${TL_IMAGE_PIP_WHEEL}" "${TL_IMAGE_WHEELS}/"
  export TL_IMAGE_PIP_WHEEL
  # Kept for the next build's --same-inputs: every wheel but this tree's own (hard links: the
  # work directory is in the cache, on the same file system).
  rm -rf "${TL_IMAGE_DEP_WHEELS}.new"
  mkdir -p "${TL_IMAGE_DEP_WHEELS}.new"
  find "${TL_IMAGE_WHEELS}" -maxdepth 1 -name '*.whl' ! -name "tidelease-${version}-*" \
    -exec cp -l -t "${TL_IMAGE_DEP_WHEELS}.new" {} +
  rm -rf "${TL_IMAGE_DEP_WHEELS}"
  mv "${TL_IMAGE_DEP_WHEELS}.new" "${TL_IMAGE_DEP_WHEELS}"
  tl::log "wheels ready in $(tl::elapsed "${start}") s:" \
    "$(find "${TL_IMAGE_WHEELS}" -name '*.whl' | wc -l) wheels"
}

# make_rootfs BASE APP - Debian's essential packages and the image's in BASE (the .debs of the
# last build reused), customized by this script (user, virtualenv, byte code, checks); then
# the virtualenv moved to APP, a layer of its own.
make_rootfs() {
  local root="$1" app="$2" start f
  local -a opts=()
  start="$(tl::now_s)"
  for f in "${TL_IMAGE_DPKG_FILTERS[@]}"; do opts+=(--dpkgopt="${f}"); done
  # shellcheck disable=SC2016 # the hooks' own shell expands them
  opts+=(
    --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr
    --skip=essential/unlink
    --setup-hook='mkdir -p "$1/var/cache/apt/archives"'
    --setup-hook='cp -pr "$TL_IMAGE_DEBS/." "$1/var/cache/apt/archives/"'
    --customize-hook="\"${TL_IMAGE_SELF}\" --customize \"\$1\""
  )
  local -a mirrors=()
  if ((SAME_INPUTS)); then
    # The .debs of the last build as a flat repository: the same packages, at their versions.
    compgen -G "${TL_IMAGE_DEBS}/*.deb" >/dev/null ||
      tl::die "--same-inputs: no Debian packages of an earlier build in ${TL_IMAGE_DEBS}"
    cp -a "${TL_IMAGE_DEBS}" "${WORK}/debs"
    python3 "${TL_HACK}/images.py" debindex "${WORK}/debs" "${TL_IMAGE_SUITE}"
    mirrors=("deb [trusted=yes] copy://${WORK}/debs ./")
  elif [[ -n "${TL_IMAGE_MIRROR}" ]]; then
    mirrors=("${TL_IMAGE_MIRROR}")
  else
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
      [[ -f "${f}" ]] && grep -qE '^[[:space:]]*(deb |Types:.*deb)' "${f}" && mirrors+=("${f}")
    done
    ((${#mirrors[@]} > 0)) || tl::die "no apt sources on this host: set TL_IMAGE_MIRROR"
  fi
  mmdebstrap --mode=root --format=directory --variant=essential \
    --include="$(IFS=, && printf '%s' "${TL_IMAGE_PACKAGES[*]}")" "${opts[@]}" \
    "${TL_IMAGE_SUITE}" "${root}" "${mirrors[@]}" >&2 || tl::die "mmdebstrap failed"

  # What the runtime provides or nothing needs: device nodes, the host's resolver and name, apt's
  # (empty) lists and cache, dpkg's and debconf's backups, apt's sources.
  find "${root}/dev" -mindepth 1 -delete
  : >"${root}/etc/resolv.conf"
  : >"${root}/etc/hostname"
  chmod 0644 "${root}/etc/resolv.conf" "${root}/etc/hostname"
  rm -rf "${root}/var/lib/apt/lists" "${root}/var/cache/apt" "${root}"/var/lib/dpkg/*-old \
    "${root}"/var/cache/debconf/*-old
  # Where this build found its packages (this machine's mirror, or with --same-inputs a copy of
  # the last build's): nothing the image needs, as it installs nothing at run time.
  rm -f "${root}/etc/apt/sources.list"
  find "${root}/etc/apt/sources.list.d" -mindepth 1 -delete
  # What dpkg's path filters leave of the documentation: empty directories, dangling links.
  find "${root}/usr/share/doc" -mindepth 2 ! -type d \
    \( ! -name copyright -o -path "${root}/usr/share/doc/*/*/*" \) -delete
  rm -f "${root}/usr/share/info/dir"
  find "${root}/usr/share/doc" "${root}/usr/share/man" "${root}/usr/share/info" \
    "${root}/usr/share/locale" "${root}/usr/share/lintian" -mindepth 1 -depth -type d -empty -delete

  install -d -m 0755 "${app}/opt"
  mv "${root}${TL_IMAGE_VENV}" "${app}${TL_IMAGE_VENV}"
  tl::log "root filesystem ready in $(tl::elapsed "${start}") s"
}

build_tidelease() {
  local version commit short dirty="" key archive start step root app source created l
  local base_what app_what
  local -a tags args
  [[ "${EUID}" -eq 0 ]] || tl::die "the tidelease image is built as root (mmdebstrap, chroot)"
  version="$(python3 -c 'import sys, tomllib
print(tomllib.load(open(sys.argv[1], "rb"))["project"]["version"])' "${TL_ROOT}/pyproject.toml")"
  commit="$(git -C "${TL_ROOT}" rev-parse HEAD)"
  short="$(git -C "${TL_ROOT}" rev-parse --short HEAD)"
  key="${version}-${short}"
  if [[ -n "$(git -C "${TL_ROOT}" status --porcelain)" ]]; then
    dirty="-dirty"
    key="${key}-dirty-$(inputs_hash)"
  fi
  # The source label is what the builder says, never the checkout's remote (a clone's remote
  # can be a path on the build machine); it is part of the cache key, as it is of the image id.
  source="${TIDELEASE_IMAGE_SOURCE:-}"
  if [[ -n "${source}" ]]; then
    key="${key}-src-$(printf '%s' "${source}" | sha256sum | cut -c1-8)"
  fi
  archive="${TL_IMAGE_CACHE}/tidelease-${key}.tar"
  cached "${archive}" && return 0

  start="$(tl::now_s)"
  ensure_mmdebstrap
  tl::require_cmd mmdebstrap chroot dpkg-deb
  # shellcheck source=lib/python.sh
  source "${TL_HACK}/lib/python.sh"
  tl::py::ensure >&2

  SOURCE_DATE_EPOCH="$(git -C "${TL_ROOT}" log -1 --format=%ct)"
  export SOURCE_DATE_EPOCH
  WORK="$(mktemp -d "${TL_IMAGE_CACHE}/work.XXXXXX")"
  export TL_IMAGE_WHEELS="${WORK}/wheels" TL_IMAGE_DEBS="${TL_IMAGE_CACHE}/debs"
  TL_IMAGE_DEP_WHEELS="${TL_IMAGE_CACHE}/wheels"
  mkdir -p "${TL_IMAGE_DEBS}"
  root="${WORK}/root"
  app="${WORK}/app"
  make_wheels "${version}"
  make_rootfs "${root}" "${app}"

  step="$(tl::now_s)"
  tags=("tidelease:${version}" "tidelease:${version}-${short}${dirty}")
  created="$(date -u -d "@${SOURCE_DATE_EPOCH}" +%Y-%m-%dT%H:%M:%SZ)"
  base_what="mmdebstrap --variant=essential ${TL_IMAGE_SUITE} + ${TL_IMAGE_PACKAGES[*]}"
  base_what+="; user ${TL_IMAGE_USER} (${TL_IMAGE_UID})"
  app_what="tidelease ${version} (${short}${dirty}) and its runtime dependencies from wheels"
  app_what+=" in ${TL_IMAGE_VENV}"
  args=(
    --tag "${tags[0]}" --tag "${tags[1]}"
    --layer "${root}=${base_what}"
    --layer "${app}=${app_what}"
    --user "${TL_IMAGE_UID}:${TL_IMAGE_UID}"
    --entrypoint "[\"${TL_IMAGE_ENTRYPOINT}\"]"
    --cmd '["--help"]'
    --workdir "/home/${TL_IMAGE_USER}"
    --label "org.opencontainers.image.title=tidelease"
    --label "org.opencontainers.image.description=${TL_IMAGE_DESCRIPTION}"
    --label "org.opencontainers.image.version=${version}"
    --label "org.opencontainers.image.revision=${commit}"
    --label "org.opencontainers.image.created=${created}"
    --label "org.opencontainers.image.licenses=Apache-2.0"
  )
  [[ -z "${source}" ]] || args+=(--label "org.opencontainers.image.source=${source}")
  for l in "${TL_IMAGE_ENV[@]}"; do args+=(--env "${l}"); done
  pack "${WORK}/image.tar" "${SOURCE_DATE_EPOCH}" "${args[@]}"
  tl::log "packed in $(tl::elapsed "${step}") s"

  mv -- "${WORK}/image.tar" "${archive}"
  prune tidelease
  tl::log "built ${archive} ($(cat "${WORK}/id"), tags ${tags[*]}," \
    "$(du -m "${archive}" | cut -f1) MiB) in $(tl::elapsed "${start}") s"
  deliver "${archive}"
}

case "${IMAGE}" in
  tidelease) build_tidelease ;;
  kube-scheduler) build_kube_scheduler ;;
esac
