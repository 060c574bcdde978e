{{/* Names, labels and the arguments of the fleetgraph container. */}}

{{- define "fleetgraph.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "fleetgraph.fullname" -}}
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

{{- define "fleetgraph.labels" -}}
{{ include "fleetgraph.componentLabels" (dict "ctx" . "component" .Values.mode) }}
{{- end }}

{{/* The labels of an object of one component, given (dict "ctx" $ "component" C). */}}
{{- define "fleetgraph.componentLabels" -}}
{{- $component := .component }}
{{- with .ctx -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "fleetgraph.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: {{ $component }}
{{- end }}
{{- end }}

{{- define "fleetgraph.selectorLabels" -}}
app.kubernetes.io/name: {{ include "fleetgraph.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "fleetgraph.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "fleetgraph.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "fleetgraph.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* The namespace of the labelled cluster Secrets: the value, else the release's. */}}
{{- define "fleetgraph.secretsNamespace" -}}
{{- default .Release.Namespace .Values.sources.secretsNamespace }}
{{- end }}

{{/* Arguments shared by serve and edge: what is collected. */}}
{{- define "fleetgraph.collectArgs" -}}
- --log-level={{ .Values.logLevel }}
- --log-format={{ .Values.logFormat }}
{{- with .Values.collect.kinds }}
- --kinds={{ join "," . }}
{{- end }}
{{- with .Values.collect.extraKinds }}
- --extra-kinds={{ join "," . }}
{{- end }}
{{- with .Values.collect.namespaces }}
- --namespaces={{ join "," . }}
{{- end }}
{{- with .Values.collect.excludeNamespaces }}
- --exclude-namespaces={{ join "," . }}
{{- end }}
{{- end }}

{{/* Whether this release is the HA manager (ha.enabled in mode manager). */}}
{{- define "fleetgraph.ha" -}}
{{- if and .Values.ha.enabled (eq .Values.mode "manager") }}true{{ end }}
{{- end }}

{{/* The component whose pods serve the API: the manager, or the query
replicas in HA. */}}
{{- define "fleetgraph.apiComponent" -}}
{{- if include "fleetgraph.ha" . }}query{{ else }}manager{{ end }}
{{- end }}

{{/*
The arguments of fleetgraph serve, given (dict "ctx" $ "role" ROLE): ROLE
is "" for the single process, "collector" or "query" in HA. A collector
gets what collects (sources, edge tokens) and no authenticator; a query
replica gets the authenticator and no sources.
*/}}
{{- define "fleetgraph.serveArgs" -}}
{{- $role := .role }}
{{- with .ctx -}}
- serve
- --listen=:8080
- --metrics-listen=:{{ .Values.metrics.port }}
{{ include "fleetgraph.collectArgs" . }}
{{- if ne $role "query" }}
- --relist={{ .Values.collect.relist }}
- --max-concurrent-syncs={{ .Values.collect.maxConcurrentSyncs }}
{{- end }}
{{- if not .Values.collect.objectDetails }}
- --disable-object-details
{{- end }}
{{- if ne $role "query" }}
- --source={{ join "," .Values.sources.names }}
{{- with .Values.sources.namespace }}
- --source-namespace={{ . }}
{{- end }}
- --argocd-namespace={{ .Values.sources.argocdNamespace }}
{{- if has "secrets" .Values.sources.names }}
- --cluster-secrets-namespace={{ include "fleetgraph.secretsNamespace" . }}
- --cluster-secrets-selector={{ .Values.sources.secretsSelector }}
{{- end }}
{{- if has "clusterprofile" .Values.sources.names }}
- --clusterprofile-provider-file=/etc/fleetgraph/clusterprofile/providers.json
{{- end }}
{{- if has "kubeconfig" .Values.sources.names }}
- --kubeconfig=/etc/fleetgraph/kubeconfig/kubeconfig
{{- range .Values.sources.clusterLabels }}
- --cluster-label={{ . }}
{{- end }}
{{- end }}
{{- end }}
{{- if ne $role "collector" }}
{{- if .Values.auth.tokensSecret }}
- --tokens-file=/etc/fleetgraph/auth/tokens.csv
{{- end }}
{{- with .Values.auth.oidc }}
{{- if .issuerURL }}
- --oidc-issuer={{ .issuerURL }}
- --oidc-client-id={{ required "auth.oidc.clientID is required with auth.oidc.issuerURL" .clientID }}
- --oidc-username-claim={{ .usernameClaim }}
{{- with .usernamePrefix }}
- --oidc-username-prefix={{ . }}
{{- end }}
{{- with .groupsClaim }}
- --oidc-groups-claim={{ . }}
{{- end }}
{{- with .groupsPrefix }}
- --oidc-groups-prefix={{ . }}
{{- end }}
{{- end }}
{{- end }}
{{- range .Values.auth.adminGroups }}
- --admin-group={{ . }}
{{- end }}
{{- if .Values.auth.allowAnonymous }}
- --allow-anonymous
{{- end }}
{{- end }}
{{- if and .Values.edge.tokensSecret (ne $role "query") }}
- --edge-tokens-file=/etc/fleetgraph/edge/edge-tokens.csv
{{- end }}
{{- with $role }}
- --role={{ . }}
- --nats-url={{ required "ha.nats.url is required with ha.enabled: the URL of a NATS JetStream cluster" $.ctx.Values.ha.nats.url }}
- --nats-stream-replicas={{ $.ctx.Values.ha.nats.streamReplicas }}
{{- if eq . "collector" }}
- --collector-id=$(POD_NAME)
- --lease-namespace={{ $.ctx.Release.Namespace }}
- --lease-duration={{ $.ctx.Values.ha.collector.leaseDuration }}
{{- end }}
{{- end }}
{{- range .Values.extraArgs }}
- {{ . }}
{{- end }}
{{- end }}
{{- end }}

{{- define "fleetgraph.edgeArgs" -}}
- edge
- --manager={{ required "edge.managerURL is required in mode edge" .Values.edge.managerURL }}
- --cluster={{ required "edge.cluster is required in mode edge" .Values.edge.cluster }}
- --token-file=/etc/fleetgraph/edge/token
- --metrics-listen=:{{ .Values.metrics.port }}
{{ include "fleetgraph.collectArgs" . }}
{{- with .Values.edge.region }}
- --region={{ . }}
{{- end }}
{{- with .Values.edge.environment }}
- --environment={{ . }}
{{- end }}
{{- range .Values.extraArgs }}
- {{ . }}
{{- end }}
{{- end }}
