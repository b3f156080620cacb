#!/usr/bin/env bash
# Build the binaries of a local Kubernetes from pinned upstream Go modules and cache them by
# version outside the checkout: $(tl::cache_dir)/bin/<version>/<name>. Only missing binaries are
# built, so a warm run does nothing and returns at once.
set -o errexit -o nounset -o pipefail

source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
# containerd 2.x (TL_CONTAINERD_VERSION, TL_CTRD2_COMPONENTS): the real node's DRA mode.
source "${TL_HACK}/lib/containerd.sh"

GO="${GO:-go}"
# Niceness of the builds; 19 keeps a 2-core machine usable for other work.
BUILD_NICE="${BUILD_NICE:-19}"
# Passed to `go build -p`; empty means Go's default (GOMAXPROCS). Set 1 if memory is short.
BUILD_PARALLELISM="${BUILD_PARALLELISM:-}"
# Rebuild even when the binary is already cached.
FORCE="${FORCE:-false}"
GOMOD_DIR="${GOMOD_DIR:-${TL_HACK}/gomod}"

usage() {
  cat <<EOF
Usage: $(basename "$0") [-f] [-l] [-h] [component...]

Builds the named components (default: all, in this order) into
  $(tl::cache_dir)/bin/<version>/<name>
skipping those already there.

Components: ${ALL_COMPONENTS[*]}
Versions:   KUBE_VERSION=${KUBE_VERSION} ETCD_VERSION=${ETCD_VERSION} KWOK_VERSION=${KWOK_VERSION}
            HELM_VERSION=${HELM_VERSION} PROMETHEUS_VERSION=${PROMETHEUS_VERSION} (promtool)
            KUEUE_VERSION=${KUEUE_VERSION} (kueue, the controller manager)
            TL_CONTAINERD_VERSION=${TL_CONTAINERD_VERSION} (${TL_CTRD2_COMPONENTS[*]})

Options:
  -f  rebuild even if cached (same as FORCE=true)
  -l  only list components and their cached paths (built or not); build nothing
  -h  this help

Environment: TIDELEASE_CACHE_DIR (cache root), GO, GOTOOLCHAIN (e.g. go1.24.13 if the local
Go cannot build a component), BUILD_NICE (${BUILD_NICE}), BUILD_PARALLELISM (go build -p).
EOF
}

TMP_FILES=()
LOCK_FD=""
BUILD_PID=""
cleanup() {
  local f
  if [[ -n "${BUILD_PID}" ]] && kill -0 "${BUILD_PID}" 2>/dev/null; then
    kill -INT "${BUILD_PID}" 2>/dev/null || true
    wait "${BUILD_PID}" 2>/dev/null || true
  fi
  for f in "${TMP_FILES[@]+"${TMP_FILES[@]}"}"; do
    rm -f -- "${f}"
  done
  if [[ -n "${LOCK_FD}" ]]; then
    exec {LOCK_FD}>&-
  fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM HUP

# Every component: common.sh's, then containerd 2.x's (pinned in hack/lib/containerd.sh).
ALL_COMPONENTS=("${TL_COMPONENTS[@]}" "${TL_CTRD2_COMPONENTS[@]}")

is_containerd() {
  case "$1" in containerd | containerd-shim-runc-v2 | ctr) return 0 ;; *) return 1 ;; esac
}

# version_of NAME - the version NAME is built at (dies on unknown names).
version_of() {
  if is_containerd "$1"; then printf '%s\n' "${TL_CONTAINERD_VERSION}"; else tl::component_version "$1"; fi
}

# dest_of NAME - where NAME's binary is cached: $(tl::cache_dir)/bin/<version>/<name>.
dest_of() {
  if is_containerd "$1"; then tl::ctrd::bin2_path "$1"; else tl::bin_path "$1"; fi
}

# gomod_of NAME - wrapper module directory and Go package for a component.
gomod_of() {
  case "$1" in
    containerd | containerd-shim-runc-v2 | ctr)
      printf '%s %s\n' "${GOMOD_DIR}/containerd" "github.com/containerd/containerd/v2/cmd/$1"
      ;;
    etcd) printf '%s %s\n' "${GOMOD_DIR}/etcd" "go.etcd.io/etcd/server/v3" ;;
    kueue) printf '%s %s\n' "${GOMOD_DIR}/kueue" "sigs.k8s.io/kueue/cmd/kueue" ;;
    kwok) printf '%s %s\n' "${GOMOD_DIR}/kwok" "sigs.k8s.io/kwok/cmd/kwok" ;;
    helm) printf '%s %s\n' "${GOMOD_DIR}/helm" "helm.sh/helm/v3/cmd/helm" ;;
    promtool)
      printf '%s %s\n' "${GOMOD_DIR}/promtool" "github.com/prometheus/prometheus/cmd/promtool"
      ;;
    *) printf '%s %s\n' "${GOMOD_DIR}/kubernetes" "k8s.io/kubernetes/cmd/$1" ;;
  esac
}

# prometheus_release VERSION - the Prometheus release of its Go module version: v0.316.0 is
# 3.16.0 (Prometheus 3.x tags its module v0.3MM.P).
prometheus_release() {
  local minor="${1#v0.}" patch
  patch="${minor#*.}"
  minor="${minor%%.*}"
  printf '%s.%s.%s\n' "${minor:0:1}" "$((10#${minor:1}))" "${patch}"
}

# reported_version NAME VERSION - what NAME's version command must print: VERSION without its
# "v", except for promtool, which reports the Prometheus release.
reported_version() {
  case "$1" in
    promtool) prometheus_release "$2" ;;
    *) printf '%s\n' "${2#v}" ;;
  esac
}

# ldflags_of NAME VERSION - linker flags that stamp the real version into the binary.
ldflags_of() {
  local name="$1" version="$2" flags=(-s -w) minor key pkg
  case "${name}" in
    etcd) ;; # etcd's version is a constant in go.etcd.io/etcd/api/v3/version.
    containerd | containerd-shim-runc-v2 | ctr)
      # As containerd's Makefile does (it also stamps the git revision, unknown here).
      flags+=("-X github.com/containerd/containerd/v2/version.Version=${version}")
      ;;
    kwok) flags+=("-X sigs.k8s.io/kwok/pkg/consts.Version=${version}") ;;
    kueue) flags+=("-X sigs.k8s.io/kueue/pkg/version.GitVersion=${version}") ;;
    promtool)
      # As Prometheus's .promu.yml does (it also stamps the branch and revision, unknown here).
      flags+=("-X github.com/prometheus/common/version.Version=$(prometheus_release "${version}")")
      ;;
    helm)
      flags+=("-X helm.sh/helm/v3/internal/version.version=${version}")
      # As helm's Makefile does: the Kubernetes version that `helm template` and `helm lint`
      # assume is that of the client-go it is built with (else 1.20).
      minor="$(awk '$1 == "k8s.io/client-go" { split($2, v, "."); print v[2] }' \
        "${GOMOD_DIR}/helm/go.mod")"
      for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
        flags+=("-X ${pkg}.k8sVersionMajor=1" "-X ${pkg}.k8sVersionMinor=${minor}")
      done
      ;;
    *)
      minor="${version#v1.}"
      minor="${minor%%.*}"
      # Same variables as kubernetes' hack/lib/version.sh sets, in both version packages.
      for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        for key in "gitVersion=${version}" "gitMajor=1" "gitMinor=${minor}" \
          "gitTreeState=archive" "buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)"; do
          flags+=("-X ${pkg}.${key}")
        done
      done
      ;;
  esac
  printf '%s\n' "${flags[*]}"
}

# version_args NAME - arguments that make a component print its version.
version_args() {
  case "$1" in
    kubectl) printf '%s\n' "version --client" ;;
    helm) printf '%s\n' "version --short" ;;
    containerd-shim-runc-v2) printf '%s\n' "-v" ;;
    *) printf '%s\n' "--version" ;;
  esac
}

# check_pinned DIR MODULE VERSION - the wrapper go.mod must pin what common.sh says.
check_pinned() {
  local dir="$1" module="$2" version="$3"
  [[ -f "${dir}/go.mod" && -f "${dir}/go.sum" ]] ||
    tl::die "${dir#"${TL_ROOT}/"}: go.mod/go.sum missing; run hack/update-gomod.sh"
  grep -Eq "^require ${module//./\\.} ${version//./\\.}\$" "${dir}/go.mod" ||
    tl::die "${dir#"${TL_ROOT}/"}/go.mod does not pin ${module} ${version}; run hack/update-gomod.sh"
}

# build NAME - build one component into the cache (atomically).
build() {
  local name="$1" version dest dir pkg module tmp start ldflags out reported
  local -a goflags=(-trimpath -mod=readonly)
  version="$(version_of "${name}")"
  dest="$(dest_of "${name}")"
  read -r dir pkg < <(gomod_of "${name}")
  case "${name}" in
    etcd) module=go.etcd.io/etcd/server/v3 ;;
    kwok) module=sigs.k8s.io/kwok ;;
    helm) module=helm.sh/helm/v3 ;;
    promtool) module=github.com/prometheus/prometheus ;;
    kueue) module=sigs.k8s.io/kueue ;;
    containerd | containerd-shim-runc-v2 | ctr) module=github.com/containerd/containerd/v2 ;;
    *) module=k8s.io/kubernetes ;;
  esac
  check_pinned "${dir}" "${module}" "${version}"
  ldflags="$(ldflags_of "${name}" "${version}")"
  [[ -z "${BUILD_PARALLELISM}" ]] || goflags+=(-p "${BUILD_PARALLELISM}")

  mkdir -p "$(dirname "${dest}")"
  tmp="$(mktemp "${dest}.tmp.XXXXXX")"
  TMP_FILES+=("${tmp}")

  tl::log "building ${name} ${version} (${pkg})"
  start="$(tl::now_s)"
  # In the background so that cleanup can stop it when this script is interrupted.
  (
    cd "${dir}"
    exec env CGO_ENABLED=0 nice -n "${BUILD_NICE}" "${GO}" build "${goflags[@]}" \
      -ldflags "${ldflags}" -o "${tmp}" "${pkg}"
  ) &
  BUILD_PID=$!
  wait "${BUILD_PID}"
  BUILD_PID=""
  chmod 0755 "${tmp}"
  if [[ "${name}" == kueue ]]; then
    # Kueue's command has no version flag; its build information names the module it was built
    # from ("dep sigs.k8s.io/kueue v0.17.0 ...").
    out="$("${GO}" version -m "${tmp}" | awk -v m="${module}" '$2 == m { print $1, $2, $3 }')"
    [[ -n "${out}" ]] ||
      tl::die "${name}: its build information does not name ${module}"
  else
    # shellcheck disable=SC2046 # version_args is meant to split
    if ! out="$("${tmp}" $(version_args "${name}") 2>&1)"; then
      tl::die "${name}: '${name} $(version_args "${name}")' fails: ${out}"
    fi
  fi
  reported="$(reported_version "${name}" "${version}")"
  [[ "${out}" == *"${reported}"* ]] ||
    tl::die "${name}: '${name} $(version_args "${name}")' does not report ${reported}: ${out}"
  mv -f -- "${tmp}" "${dest}"
  tl::log "built ${name} ${version} in $(tl::elapsed "${start}")s -> ${dest} ($(grep -m1 -F -- "${reported}" <<<"${out}" | sed 's/^[[:space:]]*//'))"
}

main() {
  local list=false opt name dest start
  local -a wanted built=()
  while getopts ":flh" opt; do
    case "${opt}" in
      f) FORCE=true ;;
      l) list=true ;;
      h) usage; exit 0 ;;
      *) usage >&2; exit 2 ;;
    esac
  done
  shift $((OPTIND - 1))
  if [[ $# -gt 0 ]]; then
    wanted=("$@")
  else
    wanted=("${ALL_COMPONENTS[@]}")
  fi
  for name in "${wanted[@]}"; do
    version_of "${name}" >/dev/null # dies on unknown names
  done

  if [[ "${list}" == true ]]; then
    for name in "${wanted[@]}"; do
      dest="$(dest_of "${name}")"
      if [[ -x "${dest}" ]]; then printf '%-24s %s\n' "${name}" "${dest}"; else printf '%-24s %s (missing)\n' "${name}" "${dest}"; fi
    done
    return 0
  fi

  missing() { [[ "${FORCE}" == true || ! -x "$(dest_of "$1")" ]]; }

  local -a todo=()
  for name in "${wanted[@]}"; do
    if missing "${name}"; then todo+=("${name}"); fi
  done
  if [[ ${#todo[@]} -eq 0 ]]; then
    tl::log "all cached: ${wanted[*]} ($(tl::cache_dir)/bin)"
    return 0
  fi

  # Early checks, only when there is something to build.
  tl::require_cmd "${GO}" nice mktemp
  tl::log "using $("${GO}" version) (GOTOOLCHAIN=$("${GO}" env GOTOOLCHAIN)), cache $(tl::cache_dir)"

  # Serialise concurrent runs (e.g. parallel test sessions); the later one finds the work done.
  mkdir -p "$(tl::cache_dir)/bin"
  if command -v flock >/dev/null 2>&1; then
    exec {LOCK_FD}>"$(tl::cache_dir)/bin/.build.lock"
    if ! flock -n "${LOCK_FD}"; then
      tl::log "another build holds $(tl::cache_dir)/bin/.build.lock; waiting"
      flock "${LOCK_FD}"
    fi
  fi

  start="$(tl::now_s)"
  for name in "${todo[@]}"; do
    if [[ "${FORCE}" != true && -x "$(dest_of "${name}")" ]]; then
      tl::log "${name}: built meanwhile by another run"
      continue
    fi
    build "${name}"
    built+=("${name}")
  done
  tl::log "done in $(tl::elapsed "${start}")s; built: ${built[*]:-nothing}"
}

main "$@"
