{{/*
Labels of every object: kustomize's `app.kubernetes.io/part-of: wasmless` (deploy/) plus
Helm's own. scripts/check-helm.sh ignores only the Helm ones when comparing with deploy/.
*/}}
{{- define "wasmless.labels" -}}
app.kubernetes.io/part-of: wasmless
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{/* REPOSITORY:TAG of an image value; the tag defaults to the chart's appVersion. */}}
{{- define "wasmless.image" -}}
{{- $tag := .image.tag | default .root.Chart.AppVersion -}}
{{- printf "%s:%s" .image.repository $tag -}}
{{- end }}

{{/*
The operator's ServiceAccount as the API server names it in requests: the admission
policy matches the operator by it.
*/}}
{{- define "wasmless.operatorUser" -}}
system:serviceaccount:{{ .Release.Namespace }}:wasmless-operator
{{- end }}

{{/* Values that cannot work together fail the render with what to change. */}}
{{- define "wasmless.validate" -}}
{{- if not (has .Values.storage.default (list "configMap" "oci")) }}
{{- fail (printf "storage.default must be configMap or oci, not %q" .Values.storage.default) }}
{{- end }}
{{- if and (eq .Values.storage.default "oci") (not .Values.storage.oci.registry) }}
{{- fail "storage.default=oci needs storage.oci.registry (host[:port][/prefix])" }}
{{- end }}
{{- if and (gt (int .Values.operator.replicas) 1) (not .Values.operator.leaderElection.enabled) }}
{{- fail "operator.replicas > 1 needs operator.leaderElection.enabled=true: without the Lease every replica would reconcile" }}
{{- end }}
{{- end }}
