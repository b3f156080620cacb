# shellcheck shell=bash
# Start and stop a throw-away control plane (etcd + kube-apiserver) on loopback, from the
# binaries that hack/build-binaries.sh caches. Source it after common.sh:
#
#   source "${TL_HACK}/lib/controlplane.sh"
#   trap tl::cp::stop EXIT
#   tl::cp::start_etcd
#   tl::cp::start_apiserver
#   tl::cp::wait_ready
#   kubectl --kubeconfig "${TL_CP_KUBECONFIG}" get ns
#
# After tl::cp::start_apiserver these are set (and exported):
#   TL_CP_DIR         working directory (data, certs, logs); removed by tl::cp::stop
#   TL_CP_ETCD_URL    http://127.0.0.1:<port>
#   TL_CP_SERVER      https://127.0.0.1:<port>
#   TL_CP_TOKEN       bearer token of a cluster-admin (group system:masters)
#   TL_CP_CA          CA bundle that verifies TL_CP_SERVER (the self-signed serving cert)
#   TL_CP_KUBECONFIG  kubeconfig using the above
# Logs are in ${TL_CP_DIR}/logs/{etcd,kube-apiserver}.log.

if [[ -n "${TL_CONTROLPLANE_SOURCED:-}" ]]; then
  return 0
fi
TL_CONTROLPLANE_SOURCED=1

# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

# Settings (override from the environment).
TL_CP_SERVICE_CIDR="${TL_CP_SERVICE_CIDR:-10.96.0.0/16}"
TL_CP_AUTHORIZATION_MODE="${TL_CP_AUTHORIZATION_MODE:-RBAC}"
# Empty: the apiserver derives it from the default route. Set it when the host has none.
TL_CP_ADVERTISE_ADDRESS="${TL_CP_ADVERTISE_ADDRESS:-}"
TL_CP_READY_TIMEOUT="${TL_CP_READY_TIMEOUT:-120}"
TL_CP_STOP_TIMEOUT="${TL_CP_STOP_TIMEOUT:-15}"
# true: leave TL_CP_DIR (logs, data) behind after tl::cp::stop, for debugging.
TL_CP_KEEP_DIR="${TL_CP_KEEP_DIR:-false}"
# Extra kube-apiserver flags (a whitespace-separated string).
TL_CP_APISERVER_EXTRA_ARGS="${TL_CP_APISERVER_EXTRA_ARGS:-}"
TL_CP_VERBOSITY="${TL_CP_VERBOSITY:-1}"

TL_CP_ETCD_PID=""
TL_CP_APISERVER_PID=""
TL_CP_OWN_DIR=false

# tl::cp::_dir - create TL_CP_DIR once (a fresh temp dir unless the caller set one).
tl::cp::_dir() {
  if [[ -z "${TL_CP_DIR:-}" ]]; then
    TL_CP_DIR="$(mktemp -d "${TMPDIR:-/tmp}/tidelease-cp.XXXXXX")"
    TL_CP_OWN_DIR=true
  fi
  mkdir -p "${TL_CP_DIR}/logs"
  export TL_CP_DIR
}

# tl::cp::_alive PID - whether PID is a running (not zombie, not reaped) process.
tl::cp::_alive() {
  local stat
  [[ -n "$1" ]] || return 1
  stat="$(ps -o stat= -p "$1" 2>/dev/null)" || return 1
  [[ -n "${stat}" && "${stat}" != Z* ]]
}

# tl::cp::_fail NAME LOG - report a failed start with the end of its log, then die.
tl::cp::_fail() {
  tl::log "$1 failed; last lines of $2:"
  tail -n 30 "$2" >&2 || true
  tl::die "$1 did not start"
}

# tl::cp::start_etcd - start a single-member etcd on free loopback ports; wait until healthy.
tl::cp::start_etcd() {
  local etcd client_port peer_port log deadline
  tl::require_cmd curl
  etcd="$(tl::bin etcd)"
  tl::cp::_dir
  client_port="$(tl::free_port)"
  peer_port="$(tl::free_port)"
  while [[ "${peer_port}" == "${client_port}" ]]; do peer_port="$(tl::free_port)"; done
  log="${TL_CP_DIR}/logs/etcd.log"
  TL_CP_ETCD_URL="http://127.0.0.1:${client_port}"
  export TL_CP_ETCD_URL

  tl::log "starting etcd on ${TL_CP_ETCD_URL}"
  "${etcd}" \
    --name=tidelease \
    --data-dir="${TL_CP_DIR}/etcd" \
    --listen-client-urls="${TL_CP_ETCD_URL}" \
    --advertise-client-urls="${TL_CP_ETCD_URL}" \
    --listen-peer-urls="http://127.0.0.1:${peer_port}" \
    --initial-advertise-peer-urls="http://127.0.0.1:${peer_port}" \
    --initial-cluster="tidelease=http://127.0.0.1:${peer_port}" \
    --unsafe-no-fsync \
    --log-level=warn \
    >"${log}" 2>&1 &
  TL_CP_ETCD_PID=$!

  deadline=$((SECONDS + 30))
  until curl -fsS --max-time 2 "${TL_CP_ETCD_URL}/health" 2>/dev/null | grep -q '"health":"true"'; do
    tl::cp::_alive "${TL_CP_ETCD_PID}" || tl::cp::_fail etcd "${log}"
    ((SECONDS < deadline)) || tl::cp::_fail "etcd (not healthy after 30s)" "${log}"
    sleep 0.2
  done
  tl::log "etcd healthy (pid ${TL_CP_ETCD_PID})"
}

# tl::cp::start_apiserver - start kube-apiserver on a free loopback port against the etcd above.
# Does not wait; call tl::cp::wait_ready.
tl::cp::start_apiserver() {
  local apiserver port log
  local -a args extra=()
  tl::require_cmd openssl
  [[ -n "${TL_CP_ETCD_URL:-}" ]] || tl::die "start etcd first (tl::cp::start_etcd)"
  apiserver="$(tl::bin kube-apiserver)"
  tl::cp::_dir
  port="$(tl::free_port)"
  log="${TL_CP_DIR}/logs/kube-apiserver.log"
  mkdir -p "${TL_CP_DIR}/certs" "${TL_CP_DIR}/auth"

  # Service-account signing key pair.
  openssl genrsa -out "${TL_CP_DIR}/auth/sa.key" 2048 2>/dev/null
  openssl rsa -in "${TL_CP_DIR}/auth/sa.key" -pubout -out "${TL_CP_DIR}/auth/sa.pub" 2>/dev/null
  # Static token of a cluster-admin: token,user,uid,"groups".
  TL_CP_TOKEN="$(openssl rand -hex 24)"
  printf '%s,tidelease-admin,tidelease-admin,"system:masters"\n' "${TL_CP_TOKEN}" \
    >"${TL_CP_DIR}/auth/tokens.csv"
  chmod 0600 "${TL_CP_DIR}/auth/"*

  TL_CP_SERVER="https://127.0.0.1:${port}"
  # kube-apiserver writes a self-signed serving cert here; it doubles as the CA bundle.
  TL_CP_CA="${TL_CP_DIR}/certs/apiserver.crt"
  TL_CP_KUBECONFIG="${TL_CP_DIR}/kubeconfig"
  export TL_CP_SERVER TL_CP_TOKEN TL_CP_CA TL_CP_KUBECONFIG

  args=(
    --etcd-servers="${TL_CP_ETCD_URL}"
    --bind-address=127.0.0.1
    --secure-port="${port}"
    --cert-dir="${TL_CP_DIR}/certs"
    --token-auth-file="${TL_CP_DIR}/auth/tokens.csv"
    --authorization-mode="${TL_CP_AUTHORIZATION_MODE}"
    --service-account-issuer=https://kubernetes.default.svc.cluster.local
    --service-account-key-file="${TL_CP_DIR}/auth/sa.pub"
    --service-account-signing-key-file="${TL_CP_DIR}/auth/sa.key"
    --service-cluster-ip-range="${TL_CP_SERVICE_CIDR}"
    # No kube-controller-manager creates token secrets, so admitting pods would fail.
    --disable-admission-plugins=ServiceAccount
    --allow-privileged=true
    --v="${TL_CP_VERBOSITY}"
  )
  [[ -z "${TL_CP_ADVERTISE_ADDRESS}" ]] || args+=(--advertise-address="${TL_CP_ADVERTISE_ADDRESS}")
  # shellcheck disable=SC2206 # word splitting intended
  [[ -z "${TL_CP_APISERVER_EXTRA_ARGS}" ]] || extra=(${TL_CP_APISERVER_EXTRA_ARGS})

  tl::log "starting kube-apiserver on ${TL_CP_SERVER}"
  "${apiserver}" "${args[@]}" "${extra[@]+"${extra[@]}"}" >"${log}" 2>&1 &
  TL_CP_APISERVER_PID=$!
}

# tl::cp::write_kubeconfig [PATH] - kubeconfig for TL_CP_SERVER/TL_CP_TOKEN (default TL_CP_KUBECONFIG).
tl::cp::write_kubeconfig() {
  local path="${1:-${TL_CP_KUBECONFIG}}"
  (
    umask 077
    cat >"${path}" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: tidelease
  cluster:
    server: ${TL_CP_SERVER}
    certificate-authority: ${TL_CP_CA}
users:
- name: tidelease-admin
  user:
    token: ${TL_CP_TOKEN}
contexts:
- name: tidelease
  context:
    cluster: tidelease
    user: tidelease-admin
current-context: tidelease
EOF
  )
}

# tl::cp::wait_ready [TIMEOUT_S] - wait until kube-apiserver's /readyz answers 200, then write
# the kubeconfig. Fails early if the apiserver exits.
tl::cp::wait_ready() {
  local timeout="${1:-${TL_CP_READY_TIMEOUT}}" log start deadline
  [[ -n "${TL_CP_APISERVER_PID}" ]] || tl::die "start kube-apiserver first (tl::cp::start_apiserver)"
  log="${TL_CP_DIR}/logs/kube-apiserver.log"
  start="$(tl::now_s)"
  deadline=$((SECONDS + timeout))
  until curl -ksf --max-time 2 -H "Authorization: Bearer ${TL_CP_TOKEN}" \
    "${TL_CP_SERVER}/readyz" >/dev/null 2>&1; do
    tl::cp::_alive "${TL_CP_APISERVER_PID}" || tl::cp::_fail kube-apiserver "${log}"
    if ((SECONDS >= deadline)); then
      curl -ks --max-time 2 -H "Authorization: Bearer ${TL_CP_TOKEN}" \
        "${TL_CP_SERVER}/readyz?verbose" >&2 || true
      tl::cp::_fail "kube-apiserver (not ready after ${timeout}s)" "${log}"
    fi
    sleep 0.3
  done
  tl::cp::write_kubeconfig
  tl::log "kube-apiserver ready in $(tl::elapsed "${start}")s (pid ${TL_CP_APISERVER_PID}); KUBECONFIG=${TL_CP_KUBECONFIG}"
}

# tl::cp::_kill NAME PID - TERM, wait up to TL_CP_STOP_TIMEOUT seconds, then KILL.
tl::cp::_kill() {
  local name="$1" pid="$2" deadline
  [[ -n "${pid}" ]] || return 0
  if tl::cp::_alive "${pid}"; then
    tl::log "stopping ${name} (pid ${pid})"
    kill -TERM "${pid}" 2>/dev/null || true
    deadline=$((SECONDS + TL_CP_STOP_TIMEOUT))
    while tl::cp::_alive "${pid}" && ((SECONDS < deadline)); do
      sleep 0.2
    done
    if tl::cp::_alive "${pid}"; then
      tl::warn "${name} (pid ${pid}) ignored SIGTERM; killing"
      kill -KILL "${pid}" 2>/dev/null || true
    fi
  fi
  wait "${pid}" 2>/dev/null || true
}

# tl::cp::stop - stop kube-apiserver, then etcd; remove TL_CP_DIR if we created it. Idempotent;
# safe to use as (part of) an EXIT trap.
tl::cp::stop() {
  tl::cp::_kill kube-apiserver "${TL_CP_APISERVER_PID}"
  TL_CP_APISERVER_PID=""
  tl::cp::_kill etcd "${TL_CP_ETCD_PID}"
  TL_CP_ETCD_PID=""
  if [[ "${TL_CP_OWN_DIR}" == true && -n "${TL_CP_DIR:-}" ]]; then
    if [[ "${TL_CP_KEEP_DIR}" == true ]]; then
      tl::log "keeping ${TL_CP_DIR}"
    else
      rm -rf -- "${TL_CP_DIR}"
    fi
    TL_CP_OWN_DIR=false
    unset TL_CP_DIR
  fi
}
