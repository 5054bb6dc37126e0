{{/*
Names. The chart's name (nameOverride) names the app; the full name
(fullnameOverride, else the release name when it contains the chart name,
else "<release>-<name>") names the namespaced objects: Deployment, metrics
Service, PodDisruptionBudget, ServiceMonitor. Cluster-scoped objects
(ClusterRoles, bindings, the allow-list, the admission fence, the CRD)
keep their names: one controller serves a cluster.
*/}}
{{- define "rbac-rules.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "rbac-rules.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* helm.sh/chart: name and version. */}}
{{- define "rbac-rules.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The labels every object of the release carries. */}}
{{- define "rbac-rules.labels" -}}
helm.sh/chart: {{ include "rbac-rules.chart" . }}
app.kubernetes.io/name: {{ include "rbac-rules.name" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/part-of: rbac-rules
{{- end }}

{{/* What the Service, the PodDisruptionBudget and the ServiceMonitor select
the controller's Pods by (the Deployment's selector: never changes). */}}
{{- define "rbac-rules.selectorLabels" -}}
app.kubernetes.io/name: {{ include "rbac-rules.name" . }}
app.kubernetes.io/component: controller
{{- end }}

{{/* Kept for templates written before rbac-rules.labels. */}}
{{- define "rbac-rules.helmLabels" -}}
helm.sh/chart: {{ include "rbac-rules.chart" . }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}

{{/*
The controller's ServiceAccount. The RBAC bindings and the admission fence
name it (the fence by its user name system:serviceaccount:NS:NAME).
*/}}
{{- define "rbac-rules.serviceAccountName" -}}
{{- default "rbac-rules" .Values.serviceAccount.name }}
{{- end }}

{{/*
An object of the chart's copies (files/), with the release's labels added
to its own and its name and ServiceAccount references following the
values. Called with (dict "obj" OBJECT "ctx" $).
*/}}
{{- define "rbac-rules.object" -}}
{{- $o := .obj }}
{{- $ctx := .ctx }}
{{- $meta := $o.metadata | default dict }}
{{- $labels := merge (dict) ($meta.labels | default dict) (include "rbac-rules.labels" $ctx | fromYaml) }}
{{- $_ := set $meta "labels" $labels }}
{{- $sa := include "rbac-rules.serviceAccountName" $ctx }}
{{- $full := include "rbac-rules.fullname" $ctx }}
{{- if eq $o.kind "ServiceAccount" }}
{{- $_ := set $meta "name" $sa }}
{{- with $ctx.Values.serviceAccount.annotations }}
{{- $_ := set $meta "annotations" (merge (dict) ($meta.annotations | default dict) .) }}
{{- end }}
{{- end }}
{{- if has $o.kind (list "Service" "PodDisruptionBudget") }}
{{- $_ := set $meta "name" (replace "rbac-rules" $full $meta.name) }}
{{- end }}
{{- if eq $o.kind "Service" }}
{{- $_ := set $o.spec "selector" (include "rbac-rules.selectorLabels" $ctx | fromYaml) }}
{{- end }}
{{- if eq $o.kind "PodDisruptionBudget" }}
{{- $_ := set $o.spec "selector" (dict "matchLabels" (include "rbac-rules.selectorLabels" $ctx | fromYaml)) }}
{{- end }}
{{- if hasKey $o "subjects" }}
{{- range $o.subjects }}
{{- if and (eq .kind "ServiceAccount") (eq .name "rbac-rules") }}
{{- $_ := set . "name" $sa }}
{{- end }}
{{- end }}
{{- end }}
{{- $_ := set $o "metadata" $meta }}
{{- toYaml $o }}
{{- end }}
