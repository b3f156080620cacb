{{/* The image of every tidelease container: repository:tag, tag defaulting to appVersion. */}}
{{- define "tidelease.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* Labels of every object; pass (dict "ctx" $ "component" "extender"). */}}
{{- define "tidelease.labels" -}}
app.kubernetes.io/name: tidelease-{{ .component }}
app.kubernetes.io/component: {{ .component }}
app.kubernetes.io/part-of: tidelease
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
helm.sh/chart: {{ .ctx.Chart.Name }}-{{ .ctx.Chart.Version }}
{{- end -}}

{{/* Selector labels of a component's pods: (dict "ctx" $ "component" "extender"). */}}
{{- define "tidelease.selector" -}}
app.kubernetes.io/name: tidelease-{{ .component }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
{{- end -}}

{{/* Environment naming the API server, when kubernetesAPI overrides the in-cluster Service. */}}
{{- define "tidelease.apiEnv" -}}
{{- with .Values.kubernetesAPI.host }}
- {name: KUBERNETES_SERVICE_HOST, value: {{ . | quote }}}
- {name: KUBERNETES_SERVICE_PORT, value: {{ required "kubernetesAPI.port is needed with kubernetesAPI.host" $.Values.kubernetesAPI.port | toString | quote }}}
{{- end }}
{{- end -}}

{{/*
Pod-level settings every tidelease pod shares. No service links: the kubelet would set
TIDELEASE_EXTENDER_PORT=tcp://... for the Service tidelease-extender, and TIDELEASE_EXTENDER_*
variables are the extender's settings.
*/}}
{{- define "tidelease.podCommon" -}}
enableServiceLinks: false
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.hostAliases }}
hostAliases:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* The container securityContext of every tidelease container but the agent's. */}}
{{- define "tidelease.restricted" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities: {drop: [ALL]}
{{- end -}}

{{/*
The shared queues' release key (queue-release-secret.yaml): the Secret, and where the extender
and the controllers find it (the settings' queue_release_key_file).
*/}}
{{- define "tidelease.queueReleaseSecret" -}}
tidelease-queue-release-key
{{- end -}}
{{- define "tidelease.queueReleaseDir" -}}
/etc/tidelease/queue-release
{{- end -}}

{{/*
The ServiceAccount token, the cluster's CA and the namespace, mounted where every Kubernetes
client looks for them: what the ServiceAccount admission plugin would add, written out so that
the pods also run where that plugin is off.
*/}}
{{- define "tidelease.apiAccessVolume" -}}
- name: kube-api-access
  projected:
    defaultMode: 420
    sources:
      - serviceAccountToken: {path: token, expirationSeconds: 3607}
      - configMap: {name: kube-root-ca.crt, items: [{key: ca.crt, path: ca.crt}]}
      - downwardAPI: {items: [{path: namespace, fieldRef: {fieldPath: metadata.namespace}}]}
{{- end -}}

{{- define "tidelease.apiAccessMount" -}}
- {name: kube-api-access, mountPath: /var/run/secrets/kubernetes.io/serviceaccount, readOnly: true}
{{- end -}}

{{/*
A ClusterRole granted to a ServiceAccount in the namespaces that opt in: a RoleBinding in each of
`namespaces`, or one ClusterRoleBinding for ["*"]; nothing for []. Pass (dict "ctx" $ "role" R
"account" A "namespaces" N).
*/}}
{{- define "tidelease.grant" -}}
{{- $ctx := .ctx }}
{{- if has "*" .namespaces }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: {{ .role }}
  labels: {{- include "tidelease.labels" (dict "ctx" $ctx "component" "rbac") | nindent 4 }}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: {{ .role }}}
subjects:
  - {kind: ServiceAccount, name: {{ .account }}, namespace: {{ $ctx.Release.Namespace }}}
{{- else }}
{{- range .namespaces }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: {{ $.role }}
  namespace: {{ . }}
  labels: {{- include "tidelease.labels" (dict "ctx" $ctx "component" "rbac") | nindent 4 }}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: {{ $.role }}}
subjects:
  - {kind: ServiceAccount, name: {{ $.account }}, namespace: {{ $ctx.Release.Namespace }}}
{{- end }}
{{- end }}
{{- end -}}

{{/*
The extender Service's DNS names (its serving certificate's names; kube-scheduler verifies one
of them: the scheduler configuration's tlsConfig.serverName), and extender.tls.extraDNSNames.
*/}}
{{- define "tidelease.extenderDNSNames" -}}
{{- $svc := printf "tidelease-extender.%s.svc" .Release.Namespace -}}
{{- toYaml (concat (list $svc (printf "%s.%s" $svc .Values.clusterDomain)) .Values.extender.tls.extraDNSNames) -}}
{{- end -}}

{{/*
"true" when cert-manager makes the extender's certificates: extender.tls.certManager true, or
auto and the cluster serves cert-manager.io/v1.
*/}}
{{- define "tidelease.certManager" -}}
{{- $want := toString .Values.extender.tls.certManager -}}
{{- if or (eq $want "true") (and (eq $want "auto") (.Capabilities.APIVersions.Has "cert-manager.io/v1")) -}}
true
{{- end -}}
{{- end -}}

{{/*
"true" when the controllers' certificate rotation makes and renews the extender's certificates
(extender/certrotation): clusterScheduler mode without cert-manager.
*/}}
{{- define "tidelease.ownCertificates" -}}
{{- if and .Values.extender.enabled (eq .Values.scheduling.mode "clusterScheduler") (not (include "tidelease.certManager" .)) -}}
true
{{- end -}}
{{- end -}}

{{- /* "true" when `tidelease controllers` runs anything (controllers.yaml): its Deployment,
ServiceAccount and RBAC exist, and so do the policies about that ServiceAccount. With the
extender, or without it in DRA mode (dra.enabled, extender.enabled=false: kube-scheduler's own
DRA places the claims, the leasing controller still lends and pins returning claims). */}}
{{- define "tidelease.controllersEnabled" -}}
{{- $c := .Values.extender.controllers -}}
{{- $dra := dig "enabled" false (.Values.dra | default dict) -}}
{{- if and (or .Values.extender.enabled $dra) (or $c.leasing $c.hotRestartOperator $c.gangs .Values.scheduling.gangScheduling $c.agentConditions $c.queues $c.prewarm $c.planner (include "tidelease.ownCertificates" .)) -}}
true
{{- end -}}
{{- end }}

{{/*
Where a component's pods go (docs/install.md, "Scheduling tidelease's own pods"): its
nodeSelector, tolerations and affinity; a replicated component (extender, controllers,
orchestrator) without an affinity of the admin's gets anti-affinity of its replicas on
kubernetes.io/hostname (antiAffinity: required, preferred or none) and, with spreadZones, a
topology spread over zones. Args: ctx, values (the component's), component, replicated.
*/}}
{{- define "tidelease.placement" -}}
{{- $v := .values -}}
{{- $selector := include "tidelease.selector" (dict "ctx" .ctx "component" .component) | fromYaml -}}
{{- with $v.nodeSelector }}
nodeSelector: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $v.tolerations }}
tolerations: {{- toYaml . | nindent 2 }}
{{- end }}
{{- if $v.affinity }}
affinity: {{- toYaml $v.affinity | nindent 2 }}
{{- else if and .replicated (eq (default "none" $v.antiAffinity) "required") }}
affinity:
  podAntiAffinity:
    requiredDuringSchedulingIgnoredDuringExecution:
      - topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels: {{- toYaml $selector | nindent 12 }}
{{- else if and .replicated (eq (default "none" $v.antiAffinity) "preferred") }}
affinity:
  podAntiAffinity:
    preferredDuringSchedulingIgnoredDuringExecution:
      - weight: 100
        podAffinityTerm:
          topologyKey: kubernetes.io/hostname
          labelSelector:
            matchLabels: {{- toYaml $selector | nindent 14 }}
{{- end }}
{{- if and .replicated $v.spreadZones }}
topologySpreadConstraints:
  - maxSkew: 1
    topologyKey: topology.kubernetes.io/zone
    whenUnsatisfiable: ScheduleAnyway
    labelSelector:
      matchLabels: {{- toYaml $selector | nindent 8 }}
{{- end }}
{{- end -}}

{{/* A component's pod labels and annotations of the admin's: the chart's podLabels and
podAnnotations, then the component's own (which win); never the selector's two labels.
Args: ctx, values, which. */}}
{{- define "tidelease.podExtras" -}}
{{- $all := merge (deepCopy (get .values .which | default dict)) (get .ctx.Values .which | default dict) -}}
{{- $all = omit $all "app.kubernetes.io/name" "app.kubernetes.io/instance" -}}
{{- with $all }}{{ toYaml . }}{{ end -}}
{{- end -}}

{{/* A PodDisruptionBudget for a replicated component: one replica out at a time (a node drain
never takes both extenders, through which every GPU pod is scheduled). Args: ctx, component,
replicas, enabled. */}}
{{- define "tidelease.pdb" -}}
{{- if and .enabled (gt (int .replicas) 1) }}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: tidelease-{{ .component }}
  namespace: {{ .ctx.Release.Namespace }}
  labels: {{- include "tidelease.labels" (dict "ctx" .ctx "component" .component) | nindent 4 }}
spec:
  maxUnavailable: 1
  selector:
    matchLabels: {{- include "tidelease.selector" (dict "ctx" .ctx "component" .component) | nindent 6 }}
{{- end }}
{{- end -}}

{{/*
The kube-scheduler image tag of ownScheduler mode: scheduling.kubeScheduler.image.tag, else the
cluster's version (what `helm install` reads from the API server, less a distribution's suffix:
v1.34.2+k3s1 -> v1.34.2). A version tag is held to Kubernetes' skew policy (kube-scheduler never
newer than the API server, at most one minor older): anything else fails the install with why.
*/}}
{{- define "tidelease.kubeSchedulerTag" -}}
{{- $cluster := regexReplaceAll "[-+].*$" .Capabilities.KubeVersion.Version "" -}}
{{- $tag := .Values.scheduling.kubeScheduler.image.tag | default $cluster -}}
{{- $m := regexFind "^v?[0-9]+[.][0-9]+" $tag -}}
{{- if $m -}}
{{- $want := split "." (trimPrefix "v" $m) -}}
{{- $minor := int $want._1 -}}
{{- $clusterMinor := regexFind "[0-9]+" .Capabilities.KubeVersion.Minor | int -}}
{{- $clusterMajor := regexFind "[0-9]+" .Capabilities.KubeVersion.Major | int -}}
{{- if or (ne (int $want._0) $clusterMajor) (gt $minor $clusterMinor) (lt $minor (sub $clusterMinor 1)) -}}
{{- fail (printf "scheduling.kubeScheduler.image.tag %s is outside Kubernetes' version skew for this cluster (%s): kube-scheduler may be the API server's minor version or one older; leave the tag empty to follow the cluster" $tag .Capabilities.KubeVersion.Version) -}}
{{- end -}}
{{- end -}}
{{- $tag -}}
{{- end -}}
