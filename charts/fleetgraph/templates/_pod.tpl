{{/*
The pod template of a fleetgraph workload, given (dict "ctx" $ "component"
COMPONENT "role" ROLE): COMPONENT labels the pods (manager, edge,
collector, query) and ROLE is serve's --role in HA ("" otherwise). Each
role mounts only what its arguments read.
*/}}
{{- define "fleetgraph.podTemplate" -}}
{{- $component := .component }}
{{- $role := .role }}
{{- with .ctx }}
{{- $manager := eq .Values.mode "manager" }}
{{- $resources := .Values.resources }}
{{- with $role }}{{ with index $.ctx.Values.ha . "resources" }}{{ $resources = . }}{{ end }}{{ end -}}
metadata:
  labels:
    {{- include "fleetgraph.selectorLabels" . | nindent 4 }}
    app.kubernetes.io/component: {{ $component }}
    {{- with .Values.podLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- with .Values.podAnnotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
spec:
  serviceAccountName: {{ include "fleetgraph.serviceAccountName" . }}
  {{- if eq $role "query" }}
  # A query replica reads only the stream: it needs no API access.
  automountServiceAccountToken: false
  {{- end }}
  {{- with .Values.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  securityContext:
    {{- toYaml .Values.podSecurityContext | nindent 4 }}
  # Websockets get a going-away close and collectors stop within this.
  terminationGracePeriodSeconds: 30
  containers:
    - name: fleetgraph
      image: {{ include "fleetgraph.image" . }}
      imagePullPolicy: {{ .Values.image.pullPolicy }}
      args:
        {{- if eq .Values.mode "edge" }}
        {{- include "fleetgraph.edgeArgs" . | nindent 8 }}
        {{- else }}
        {{- include "fleetgraph.serveArgs" (dict "ctx" . "role" $role) | nindent 8 }}
        {{- end }}
      {{- if eq $role "collector" }}
      env:
        # The collector's name among the others (--collector-id): the
        # StatefulSet's pod name, the same across restarts.
        - name: POD_NAME
          valueFrom:
            fieldRef:
              fieldPath: metadata.name
      {{- end }}
      securityContext:
        {{- toYaml .Values.securityContext | nindent 8 }}
      resources:
        {{- toYaml $resources | nindent 8 }}
      {{- if $manager }}
      ports:
        - name: http
          containerPort: 8080
          protocol: TCP
        - name: metrics
          containerPort: {{ .Values.metrics.port }}
          protocol: TCP
      {{- if eq $role "query" }}
      # Ready once the replica has applied everything the stream held
      # when it started (docs/scale-out.md).
      {{- end }}
      readinessProbe:
        httpGet:
          path: /readyz
          port: http
        periodSeconds: 5
        failureThreshold: 3
      livenessProbe:
        httpGet:
          path: /healthz
          port: http
        periodSeconds: 10
        failureThreshold: 6
      {{- else if eq .Values.mode "edge" }}
      ports:
        - name: metrics
          containerPort: {{ .Values.metrics.port }}
          protocol: TCP
      {{- end }}
      volumeMounts:
        - name: tmp
          mountPath: /tmp
        {{- if and $manager .Values.auth.tokensSecret (ne $role "collector") }}
        - name: auth
          mountPath: /etc/fleetgraph/auth
          readOnly: true
        {{- end }}
        {{- if or (eq .Values.mode "edge") (and $manager .Values.edge.tokensSecret (ne $role "query")) }}
        - name: edge
          mountPath: /etc/fleetgraph/edge
          readOnly: true
        {{- end }}
        {{- if and $manager (has "clusterprofile" .Values.sources.names) (ne $role "query") }}
        - name: clusterprofile
          mountPath: /etc/fleetgraph/clusterprofile
          readOnly: true
        {{- end }}
        {{- if and $manager (has "kubeconfig" .Values.sources.names) (ne $role "query") }}
        - name: kubeconfig
          mountPath: /etc/fleetgraph/kubeconfig
          readOnly: true
        {{- end }}
  volumes:
    - name: tmp
      emptyDir: {}
    {{- if and $manager .Values.auth.tokensSecret (ne $role "collector") }}
    - name: auth
      secret:
        secretName: {{ .Values.auth.tokensSecret }}
        items:
          - key: tokens.csv
            path: tokens.csv
    {{- end }}
    {{- if eq .Values.mode "edge" }}
    - name: edge
      secret:
        secretName: {{ required "edge.tokenSecret is required in mode edge" .Values.edge.tokenSecret }}
        items:
          - key: token
            path: token
    {{- else if and .Values.edge.tokensSecret (ne $role "query") }}
    - name: edge
      secret:
        secretName: {{ .Values.edge.tokensSecret }}
        items:
          - key: edge-tokens.csv
            path: edge-tokens.csv
    {{- end }}
    {{- if and $manager (has "clusterprofile" .Values.sources.names) (ne $role "query") }}
    - name: clusterprofile
      configMap:
        name: {{ include "fleetgraph.fullname" . }}-clusterprofile
    {{- end }}
    {{- if and $manager (has "kubeconfig" .Values.sources.names) (ne $role "query") }}
    - name: kubeconfig
      secret:
        secretName: {{ required "sources.kubeconfigSecret is required with the kubeconfig source" .Values.sources.kubeconfigSecret }}
        items:
          - key: kubeconfig
            path: kubeconfig
    {{- end }}
  {{- with .Values.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- if .Values.affinity }}
  affinity:
    {{- toYaml .Values.affinity | nindent 4 }}
  {{- else if and $role (ne .Values.ha.antiAffinity "none") }}
  # Replicas of a role on different nodes, so that losing a node loses
  # at most one of them.
  affinity:
    podAntiAffinity:
      {{- $term := dict "topologyKey" "kubernetes.io/hostname" "labelSelector" (dict "matchLabels" (merge (include "fleetgraph.selectorLabels" . | fromYaml) (dict "app.kubernetes.io/component" $component))) }}
      {{- if eq .Values.ha.antiAffinity "hard" }}
      requiredDuringSchedulingIgnoredDuringExecution:
        {{- toYaml (list $term) | nindent 8 }}
      {{- else }}
      preferredDuringSchedulingIgnoredDuringExecution:
        - weight: 100
          podAffinityTerm:
            {{- toYaml $term | nindent 12 }}
      {{- end }}
  {{- end }}
  {{- with .Values.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}
{{- end }}
