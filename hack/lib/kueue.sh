# shellcheck shell=bash
# Kueue's controller manager on a running local cluster (issue 37; docs/kueue.md): the binary
# hack/build-binaries.sh builds from the pinned module (KUEUE_VERSION), its CRDs and webhook
# configurations from the same module, its webhooks served on loopback with their certificates.
# Source it after common.sh and python.sh.
#
# The API server calls Kueue's webhooks (the CRDs' conversion, the mutating and validating
# admission webhooks of Kueue's own kinds and of batch Jobs) at https://127.0.0.1:PORT, the
# `url` form of a webhook's clientConfig: a local cluster has no Service network. Kueue keeps
# its own certificate management (internalCertManagement, on as in its release manifests): it
# finds the Secret kueue-webhook-server-cert made here valid (a CA named kueue-ca, a serving
# certificate for kueue-webhook-service.kueue-system.svc that also names 127.0.0.1), keeps it,
# and injects the CA into the webhook configurations and CRDs itself; the same files are in its
# certificate directory, where a pod would have the Secret mounted. Only the webhooks of the
# integration it runs (batch/job) and of its own kinds are registered. It runs as the cluster's
# admin (its RBAC is Kueue's concern, not tidelease's), without leader election, metrics or the
# visibility API server (which would write certificates under /visibility).
#
#   tl::kueue::start DIR KUBECONFIG   start Kueue (files under DIR) and wait until it is ready
#   tl::kueue::stop                   stop it and remove its webhook configurations

TL_KUEUE_NAMESPACE=kueue-system
TL_KUEUE_PID=""
TL_KUEUE_DIR=""
TL_KUEUE_KUBECONFIG=""
TL_KUEUE_HEALTH_URL=""
TL_KUEUE_READY_TIMEOUT="${TL_KUEUE_READY_TIMEOUT:-120}"
# The webhook configurations Kueue's certificate management injects its CA into (their names
# follow from webhookServiceName kueue-webhook-service).
TL_KUEUE_WEBHOOKS=(
  mutatingwebhookconfiguration/kueue-mutating-webhook-configuration
  validatingwebhookconfiguration/kueue-validating-webhook-configuration
)

# tl::kueue::module_dir - the pinned Kueue module's source (downloaded by the Go toolchain).
tl::kueue::module_dir() {
  tl::module_dir sigs.k8s.io/kueue "${KUEUE_VERSION}" config/components/crd/bases
}

# tl::kueue::certs DIR - DIR/certs/{ca.crt,ca.key,tls.crt,tls.key}: RSA keys in PKCS #1 (what
# Kueue's certificate management reads back), valid a year (it renews what expires within 90
# days).
tl::kueue::certs() {
  local dir="$1/certs" log="$1/certs.log"
  mkdir -p "${dir}"
  printf '%s\n' "basicConstraints=critical,CA:FALSE" "keyUsage=critical,digitalSignature,keyEncipherment" \
    "extendedKeyUsage=serverAuth" \
    "subjectAltName=DNS:kueue-webhook-service.${TL_KUEUE_NAMESPACE}.svc,IP:127.0.0.1" >"$1/serving.ext"
  {
    openssl genrsa -traditional -out "${dir}/ca.key" 2048 &&
      openssl req -x509 -new -key "${dir}/ca.key" -days 365 -subj "/O=kueue/CN=kueue-ca" \
        -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,digitalSignature \
        -addext subjectAltName=DNS:kueue-ca -out "${dir}/ca.crt" &&
      openssl genrsa -traditional -out "${dir}/tls.key" 2048 &&
      openssl req -new -key "${dir}/tls.key" \
        -subj "/CN=kueue-webhook-service.${TL_KUEUE_NAMESPACE}.svc" -out "$1/serving.csr" &&
      openssl x509 -req -in "$1/serving.csr" -CA "${dir}/ca.crt" -CAkey "${dir}/ca.key" \
        -CAcreateserial -days 365 -extfile "$1/serving.ext" -out "${dir}/tls.crt"
  } >"${log}" 2>&1 || tl::die "making Kueue's certificates failed; see ${log}"
  chmod 0600 "${dir}"/*.key
}

# tl::kueue::manifests SRC DIR PORT - DIR/manifests.yaml: Kueue's CRDs and webhook
# configurations for this cluster (url clientConfigs on PORT with the CA of DIR/certs).
tl::kueue::manifests() {
  "${TL_PY}" - "$1" "$2" "$3" "${TL_KUEUE_NAMESPACE}" <<'EOF'
import base64
import glob
import os
import sys

import yaml

src, out, port, namespace = sys.argv[1:]
with open(os.path.join(out, "certs", "ca.crt"), "rb") as f:
    ca = base64.b64encode(f.read()).decode()
url = f"https://127.0.0.1:{port}"
docs = []
# The CRDs Kueue's release converts between versions (config/components/crd/kustomization.yaml)
# and whose CA its certificate management injects.
converted = {"localqueues", "clusterqueues", "workloads", "cohorts", "multikueueclusters"}
for path in sorted(glob.glob(os.path.join(src, "config/components/crd/bases/*.yaml"))):
    with open(path) as f:
        crd = yaml.safe_load(f)
    if crd["spec"]["names"]["plural"] in converted:
        crd["spec"]["conversion"] = {
            "strategy": "Webhook",
            "webhook": {
                "clientConfig": {"url": f"{url}/convert", "caBundle": ca},
                "conversionReviewVersions": ["v1"],
            },
        }
    docs.append(crd)
with open(os.path.join(src, "config/components/webhook/manifests.yaml")) as f:
    configs = [d for d in yaml.safe_load_all(f) if d]
# The webhooks of Kueue's own kinds and of the one integration run here (batch/job).
served = {"kueue.x-k8s.io", "batch"}
system = {
    "matchExpressions": [
        {
            "key": "kubernetes.io/metadata.name",
            "operator": "NotIn",
            "values": ["kube-system", namespace, "tidelease-system"],
        }
    ]
}
for config in configs:
    kind = "mutating" if config["kind"] == "MutatingWebhookConfiguration" else "validating"
    config["metadata"] = {"name": f"kueue-{kind}-webhook-configuration"}
    kept = []
    for hook in config.get("webhooks") or []:
        groups = {g for rule in hook.get("rules") or [] for g in rule.get("apiGroups") or []}
        if not groups or not groups <= served:
            continue
        path = hook["clientConfig"]["service"]["path"]
        hook["clientConfig"] = {"url": f"{url}{path}", "caBundle": ca}
        if "batch" in groups:
            hook["namespaceSelector"] = system
        kept.append(hook)
    config["webhooks"] = kept
    docs.append(config)
docs.append({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
with open(os.path.join(out, "manifests.yaml"), "w") as f:
    yaml.safe_dump_all(docs, f, sort_keys=False)
EOF
}

# tl::kueue::secret DIR - the Secret Kueue's certificate management keeps (DIR/certs).
tl::kueue::secret() {
  local dir="$1/certs"
  "$(tl::bin kubectl)" --kubeconfig "${TL_KUEUE_KUBECONFIG}" -n "${TL_KUEUE_NAMESPACE}" \
    create secret generic kueue-webhook-server-cert --from-file="${dir}/ca.crt" \
    --from-file="${dir}/ca.key" --from-file="${dir}/tls.crt" --from-file="${dir}/tls.key" \
    --dry-run=client -o yaml |
    "$(tl::bin kubectl)" --kubeconfig "${TL_KUEUE_KUBECONFIG}" apply --server-side -f - >/dev/null
}

tl::kueue::start() {
  local dir="$1" src webhook_port health_port kubectl start
  TL_KUEUE_DIR="${dir}" TL_KUEUE_KUBECONFIG="$2"
  kubectl="$(tl::bin kubectl)"
  start="$(tl::now_s)"
  mkdir -p "${dir}"
  src="$(tl::kueue::module_dir)"
  webhook_port="$(tl::free_port)"
  health_port="$(tl::free_port)"
  tl::kueue::certs "${dir}"
  tl::kueue::manifests "${src}" "${dir}" "${webhook_port}"
  "${kubectl}" --kubeconfig "$2" apply --server-side --force-conflicts \
    -f "${dir}/manifests.yaml" >"${dir}/apply.log" 2>&1 ||
    tl::die "applying Kueue's CRDs and webhooks failed; see ${dir}/apply.log"
  tl::kueue::secret "${dir}"
  cat >"${dir}/config.yaml" <<EOF
apiVersion: config.kueue.x-k8s.io/v1beta2
kind: Configuration
namespace: ${TL_KUEUE_NAMESPACE}
health:
  healthProbeBindAddress: 127.0.0.1:${health_port}
metrics:
  bindAddress: "0"
webhook:
  host: 127.0.0.1
  port: ${webhook_port}
  certDir: ${dir}/certs
leaderElection:
  leaderElect: false
internalCertManagement:
  enable: true
  webhookServiceName: kueue-webhook-service
  webhookSecretName: kueue-webhook-server-cert
manageJobsWithoutQueueName: false
integrations:
  frameworks: ["batch/job"]
EOF
  KUBECONFIG="$2" "$(tl::bin kueue)" --config="${dir}/config.yaml" \
    --feature-gates=VisibilityOnDemand=false --zap-log-level=info \
    >"${dir}/kueue.log" 2>&1 &
  TL_KUEUE_PID=$!
  TL_KUEUE_HEALTH_URL="http://127.0.0.1:${health_port}"
  tl::log "started Kueue ${KUEUE_VERSION} (pid ${TL_KUEUE_PID}), webhooks on 127.0.0.1:${webhook_port}"
  local deadline=$((SECONDS + TL_KUEUE_READY_TIMEOUT))
  until curl -fsS -o /dev/null "${TL_KUEUE_HEALTH_URL}/readyz" 2>/dev/null; do
    kill -0 "${TL_KUEUE_PID}" 2>/dev/null || tl::die "Kueue exited; see ${dir}/kueue.log"
    ((SECONDS < deadline)) || tl::die "Kueue not ready after ${TL_KUEUE_READY_TIMEOUT}s; see ${dir}/kueue.log"
    sleep 0.5
  done
  # Ready means its webhooks serve: a dry run of a ClusterQueue goes through its mutating and
  # validating webhooks.
  until "${kubectl}" --kubeconfig "$2" create --dry-run=server -f - >/dev/null 2>&1 <<EOF; do
apiVersion: kueue.x-k8s.io/v1beta2
kind: ClusterQueue
metadata: {name: tidelease-probe}
spec: {namespaceSelector: {}}
EOF
    kill -0 "${TL_KUEUE_PID}" 2>/dev/null || tl::die "Kueue exited; see ${dir}/kueue.log"
    ((SECONDS < deadline)) || tl::die "Kueue's webhooks do not answer after ${TL_KUEUE_READY_TIMEOUT}s; see ${dir}/kueue.log"
    sleep 0.5
  done
  tl::log "Kueue ready in $(tl::elapsed "${start}")s"
}

tl::kueue::stop() {
  if [[ -n "${TL_KUEUE_PID}" ]] && kill -0 "${TL_KUEUE_PID}" 2>/dev/null; then
    kill -TERM "${TL_KUEUE_PID}" 2>/dev/null || true
    local i
    for i in $(seq 1 100); do
      kill -0 "${TL_KUEUE_PID}" 2>/dev/null || break
      sleep 0.1
    done
    kill -KILL "${TL_KUEUE_PID}" 2>/dev/null || true
  fi
  TL_KUEUE_PID=""
  # Without Kueue its webhooks would refuse every Job and Kueue object of the cluster.
  if [[ -n "${TL_KUEUE_KUBECONFIG}" ]]; then
    "$(tl::bin kubectl)" --kubeconfig "${TL_KUEUE_KUBECONFIG}" delete --ignore-not-found \
      "${TL_KUEUE_WEBHOOKS[@]}" >/dev/null 2>&1 || true
  fi
}

# tl::kueue::alive - fails (with a warning, once) when Kueue has exited (tl::supervise's check).
tl::kueue::alive() {
  if [[ -n "${TL_KUEUE_PID}" ]] && ! kill -0 "${TL_KUEUE_PID}" 2>/dev/null; then
    tl::warn "Kueue exited; see ${TL_KUEUE_DIR}/kueue.log"
    TL_KUEUE_PID=""
  fi
  return 0
}
