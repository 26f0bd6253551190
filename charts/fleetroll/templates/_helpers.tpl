{{/* Chart name. */}}
{{- define "fleetroll.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: release-chart, or the release name when it already contains the chart name. */}}
{{- define "fleetroll.fullname" -}}
{{- if contains .Chart.Name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "fleetroll.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "fleetroll.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "fleetroll.selectorLabels" -}}
app.kubernetes.io/name: {{ include "fleetroll.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "fleetroll.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "fleetroll.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
The fleet namespace: where cross-namespace FleetRollouts are honoured; "" for none. Never the release
namespace: whoever may edit the operator's own namespace (create pods with its ServiceAccount, read its
token) holds the operator's rights, so fleet administrators, who need `edit` in the fleet namespace, must
not get it there.
*/}}
{{- define "fleetroll.fleetNamespace" -}}
{{- if and .Values.fleetNamespace (eq .Values.fleetNamespace .Release.Namespace) }}
{{- fail (printf "fleetNamespace must not be the release namespace %q: fleet administrators get edit in the fleet namespace, and edit in the operator's own namespace is the operator's rights; use a namespace of its own, e.g. fleetroll-fleet" .Release.Namespace) }}
{{- end }}
{{- .Values.fleetNamespace }}
{{- end }}

{{- define "fleetroll.audience" -}}
{{- default (printf "http://%s.%s.svc:%d/mcp" (include "fleetroll.fullname" .) .Release.Namespace (int .Values.service.port)) .Values.mcp.audience }}
{{- end }}

{{/* What the operator writes in a rollout's namespace: cluster-wide, or only in watchNamespace. */}}
{{- define "fleetroll.rolloutWriteRules" -}}
# A node rollout carries a finalizer while it holds its DaemonSet (patch); finished rollouts past their
# TTL are deleted (delete). The MCP server creates and changes rollouts as its caller, never as itself.
- apiGroups: ["fleetroll.dev"]
  resources: ["fleetrollouts"]
  verbs: ["patch", "delete"]
# The durable checkpoint, written with a resourceVersion precondition (PUT).
- apiGroups: ["fleetroll.dev"]
  resources: ["fleetrollouts/status"]
  verbs: ["update"]
# Large plans: immutable ConfigMaps owned by their rollout, written once and read back; nothing else.
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["create", "get"]
# An event on every transition, regarding the rollout (so in its namespace).
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- end }}

{{/* The metrics listener's port, which must not be the main listener's. */}}
{{- define "fleetroll.metricsPort" -}}
{{- if eq (int .Values.metrics.port) (int .Values.service.port) }}
{{- fail (printf "metrics.port must differ from service.port (both %d): /metrics has a listener of its own" (int .Values.service.port)) }}
{{- end }}
{{- .Values.metrics.port }}
{{- end }}

{{/*
The pods' topology spread: the user's constraints (labelSelector defaulting to the chart's pods), else, for
more than one replica and no user affinity, a soft spread across nodes and zones. Soft (ScheduleAnyway):
a cluster of one node or one zone still schedules every replica. pod-template-hash counts only the pods of
the current ReplicaSet, so a rolling update spreads the new pods too.
*/}}
{{- define "fleetroll.topologySpreadConstraints" -}}
{{- $selector := dict "matchLabels" (include "fleetroll.selectorLabels" . | fromYaml) }}
{{- if .Values.topologySpreadConstraints }}
topologySpreadConstraints:
{{- range .Values.topologySpreadConstraints }}
{{- $constraint := deepCopy . }}
{{- if not $constraint.labelSelector }}
{{- $_ := set $constraint "labelSelector" $selector }}
{{- end }}
  - {{ toYaml $constraint | indent 4 | trim }}
{{- end }}
{{- else if and .Values.defaultTopologySpread (gt (int .Values.replicaCount) 1) (not (dig "podAntiAffinity" nil .Values.affinity)) }}
topologySpreadConstraints:
{{- range list "kubernetes.io/hostname" "topology.kubernetes.io/zone" }}
  - topologyKey: {{ . }}
    maxSkew: 1
    whenUnsatisfiable: ScheduleAnyway
    labelSelector:
      {{- toYaml $selector | nindent 6 }}
    matchLabelKeys:
      - pod-template-hash
{{- end }}
{{- end }}
{{- end }}

{{/*
The operator's image: repository@digest when a digest is set (what is pulled cannot change), else
repository:tag (the chart's appVersion by default).
*/}}
{{- define "fleetroll.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end }}
