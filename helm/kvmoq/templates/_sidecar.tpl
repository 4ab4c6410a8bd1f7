{{/*
Named templates that inject the kvmoq sidecar into a pod. inference.yaml uses them, and so
can another chart that lists this one as a dependency, passing this chart's values:

  {{- $kvmoq := dict "Values" .Values.kvmoq "Release" .Release }}
  initContainers:   # sidecar.native: true (containers: when false)
    {{- include "kvmoq.sidecarContainer" $kvmoq | nindent 4 }}
  containers:
    - name: model-server
      env:
        {{- include "kvmoq.modelServerEnv" $kvmoq | nindent 8 }}
      volumeMounts:
        {{- include "kvmoq.modelServerMounts" $kvmoq | nindent 8 }}
  volumes:
    {{- include "kvmoq.sidecarVolumes" $kvmoq | nindent 4 }}

and on the pod template, `metadata.annotations: {{- include "kvmoq.podAnnotations" $kvmoq
| nindent ... }}` (Prometheus' scrape annotations for the sidecar's metrics port).

Each renders YAML list items, but podAnnotations a YAML map (empty when there are none). The context needs .Values (this chart's) and .Release;
sidecarContainer also takes .resourceClaims (DRA claims the sidecar shares) and
.visibleDevices (NVIDIA_VISIBLE_DEVICES), both optional.
*/}}

{{- define "kvmoq.socketPath" -}}
{{ trimSuffix "/" .Values.sidecar.socketDir }}/sidecar.sock
{{- end }}

{{- define "kvmoq.relayURL" -}}
{{- $url := .Values.sidecar.relayURL -}}
{{- if and (not $url) .Values.relay.enabled -}}
{{- $service := include "kvmoq.relayService" (list . (ternary "edge" "root" .Values.relay.edges.enabled)) -}}
{{- /* The name in full: pods of other namespaces (injected ones) dial it too. */ -}}
{{- $url = printf "moqt://%s.%s.svc:%v" $service .Release.Namespace .Values.relay.port -}}
{{- end -}}
{{- if not $url -}}
{{- fail "sidecar.relayURL is required when relay.enabled is false: the moqt://HOST:PORT of the relay the sidecars use" -}}
{{- end -}}
{{- if not (hasPrefix "moqt://" $url) -}}
{{- fail (printf "sidecar.relayURL must be moqt://HOST:PORT, got %q" $url) -}}
{{- end -}}
{{ $url }}
{{- end }}

{{- define "kvmoq.caSecret" -}}
{{- if .Values.sidecar.ca.secret -}}
{{ .Values.sidecar.ca.secret }}
{{- else if .Values.relay.enabled -}}
{{ .Values.relay.tlsSecret }}
{{- end -}}
{{- end }}

{{/* A setting's value as the sidecar's parsers read it: lists joined by commas, whole
numbers without an exponent. */}}
{{- define "kvmoq.settingValue" -}}
{{- if kindIs "slice" . -}}
{{ join "," . }}
{{- else if and (kindIs "float64" .) (eq . (float64 (int64 .))) -}}
{{ int64 . }}
{{- else -}}
{{ . }}
{{- end -}}
{{- end }}

{{- define "kvmoq.sidecarProbe" -}}
{{- $s := .Values.sidecar -}}
{{- if eq $s.probes "grpc" -}}
grpc: {port: {{ $s.probePort }}{{ if .service }}, service: {{ .service }}{{ end }}}
{{- else -}}
httpGet: {path: {{ .path }}, port: {{ $s.metricsPort }}}
{{- end -}}
{{- end }}

{{- define "kvmoq.sidecarContainer" -}}
{{- $s := .Values.sidecar -}}
{{- if not (has $s.probes (list "http" "grpc")) -}}
{{- fail (printf "sidecar.probes must be http or grpc, got %q" $s.probes) -}}
{{- end -}}
{{- $live := dict "Values" .Values "path" "/healthz" "service" "" -}}
{{- $ready := $live -}}
{{- if $s.readinessRequiresRelay -}}
{{- $ready = dict "Values" .Values "path" "/readyz" "service" "kvmoq.v1.KVCacheService" -}}
{{- end -}}
{{- $resources := deepCopy ($s.resources | default dict) -}}
{{- with .resourceClaims -}}
{{- $_ := set $resources "claims" . -}}
{{- end -}}
- name: kvmoq-sidecar
  image: "{{ .Values.image.repository }}:{{ .Values.image.tag }}"
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  command: ["kvmoq", "sidecar"]
  {{- if $s.native }}
  restartPolicy: Always
  {{- end }}
  env:
    - {name: KVMOQ_RELAY, value: {{ include "kvmoq.relayURL" . | quote }}}
    {{- if include "kvmoq.caSecret" . }}
    - {name: KVMOQ_CA, value: {{ printf "/etc/kvmoq/ca/%s" $s.ca.key | quote }}}
    {{- end }}
    {{- range $value, $env := include "kvmoq.secretFiles" . | fromYaml }}
    {{- with index $s $value }}{{ if .secret }}
    - {name: {{ $env }}, value: {{ printf "/etc/kvmoq/%s/%s" (kebabcase $value) .key | quote }}}
    {{- end }}{{ end }}
    {{- end }}
    - {name: KVMOQ_GRPC, value: {{ printf "unix://%s" (include "kvmoq.socketPath" .) | quote }}}
    - {name: KVMOQ_PROBE, value: "{{ eq $s.probes "grpc" | ternary "0.0.0.0" "127.0.0.1" }}:{{ $s.probePort }}"}
    - {name: KVMOQ_HTTP, value: "0.0.0.0:{{ $s.metricsPort }}"}
    - {name: KVMOQ_SHM_ROOTS, value: /dev/shm}
    - {name: KVMOQ_LOG_FORMAT, value: json}
    {{- range $name, $value := $s.settings }}
    - {name: {{ printf "KVMOQ_%s" (upper $name) }}, value: {{ include "kvmoq.settingValue" $value | quote }}}
    {{- end }}
    {{- with .visibleDevices }}
    - {name: NVIDIA_VISIBLE_DEVICES, value: {{ . | quote }}}
    {{- end }}
    {{- with $s.env }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  ports:
    - {name: kvmoq-grpc, containerPort: {{ $s.probePort }}, protocol: TCP}
    - {name: kvmoq-metrics, containerPort: {{ $s.metricsPort }}, protocol: TCP}
  # Importing torch takes a while: up to a minute before liveness applies.
  startupProbe:
    {{- include "kvmoq.sidecarProbe" $live | nindent 4 }}
    periodSeconds: 2
    failureThreshold: 30
  livenessProbe:
    {{- include "kvmoq.sidecarProbe" $live | nindent 4 }}
    periodSeconds: 10
    failureThreshold: 3
  readinessProbe:
    {{- include "kvmoq.sidecarProbe" $ready | nindent 4 }}
    periodSeconds: 5
    failureThreshold: 2
  resources: {{- toYaml $resources | nindent 4 }}
  {{- with $s.securityContext }}
  securityContext: {{- toYaml . | nindent 4 }}
  {{- end }}
  volumeMounts:
    - {name: kvmoq-socket, mountPath: {{ $s.socketDir }}}
    - {name: kvmoq-shm, mountPath: /dev/shm}
    {{- if include "kvmoq.caSecret" . }}
    - {name: kvmoq-ca, mountPath: /etc/kvmoq/ca, readOnly: true}
    {{- end }}
    {{- range $value, $env := include "kvmoq.secretFiles" . | fromYaml }}
    {{- if (index $s $value).secret }}
    - {name: {{ printf "kvmoq-%s" (kebabcase $value) }}, mountPath: {{ printf "/etc/kvmoq/%s" (kebabcase $value) }}, readOnly: true}
    {{- end }}
    {{- end }}
{{- end }}

{{- define "kvmoq.modelServerEnv" -}}
- {name: KVMOQ_GRPC, value: {{ printf "unix://%s" (include "kvmoq.socketPath" .) | quote }}}
{{- end }}

{{- define "kvmoq.podAnnotations" -}}
{{- if .Values.sidecar.metrics.podAnnotations -}}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .Values.sidecar.metricsPort | toString | quote }}
prometheus.io/path: /metrics
{{- end -}}
{{- end }}

{{- define "kvmoq.modelServerMounts" -}}
- {name: kvmoq-socket, mountPath: {{ .Values.sidecar.socketDir }}}
- {name: kvmoq-shm, mountPath: /dev/shm}
{{- end }}

{{- define "kvmoq.sidecarVolumes" -}}
- name: kvmoq-socket
  emptyDir: {}
- name: kvmoq-shm
  emptyDir: {medium: Memory, sizeLimit: {{ .Values.sidecar.shmSizeLimit }}}
{{- with include "kvmoq.caSecret" . }}
- name: kvmoq-ca
  secret:
    secretName: {{ . }}
    items:
      - {key: {{ $.Values.sidecar.ca.key }}, path: {{ $.Values.sidecar.ca.key }}}
{{- end }}
{{- range $value, $env := include "kvmoq.secretFiles" . | fromYaml }}
{{- with index $.Values.sidecar $value }}{{ if .secret }}
- name: {{ printf "kvmoq-%s" (kebabcase $value) }}
  secret:
    secretName: {{ .secret }}
    items:
      - {key: {{ .key }}, path: {{ .key }}}
{{- end }}{{ end }}
{{- end }}
{{- end }}

{{/* Secrets the sidecar reads as files: the sidecar value that names the Secret, and the
environment variable that gives the sidecar the file's path. */}}
{{- define "kvmoq.secretFiles" -}}
token: KVMOQ_TOKEN_FILE
promptKey: KVMOQ_PROMPT_KEY_FILE
catalogKey: KVMOQ_CATALOG_KEY_FILE
trustedKeys: KVMOQ_TRUSTED_KEYS_FILE
{{- end }}
