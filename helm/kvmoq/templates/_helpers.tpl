{{- define "kvmoq.inferenceName" -}}
{{ .Values.inference.name | default (printf "%s-inference" .Release.Name) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "kvmoq.inferenceSelector" -}}
app.kubernetes.io/name: kvmoq-inference
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Labels of one tier of relays: (list $ "root") or (list $ "edge"). */}}
{{- define "kvmoq.relaySelector" -}}
{{- $ := index . 0 -}}
app.kubernetes.io/name: kvmoq-relay
app.kubernetes.io/instance: {{ $.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end }}

{{/*
The pod spec of a relay, root or edge (one definition, so the tiers cannot drift):
(dict "root" $ "upstream" URL-or-empty "resources" MAP). An edge trusts the root's
certificate through the ca.crt of the same Secret, which must cover both Service names.
*/}}
{{- define "kvmoq.relayPodSpec" -}}
{{- $ := .root -}}
{{- $relay := $.Values.relay -}}
# SIGTERM makes the relay send GOAWAY and close sessions before exit.
terminationGracePeriodSeconds: 30
containers:
  - name: relay
    image: "{{ $.Values.relayImage.repository }}:{{ $.Values.image.tag }}"
    imagePullPolicy: {{ $.Values.image.pullPolicy }}
    command: ["kvmoq"]
    args:
      - relay
      - --listen=0.0.0.0:{{ $relay.port }}
      - --cert=/tls/tls.crt
      - --key=/tls/tls.key
      - --cache-bytes={{ $relay.cacheBytes | int64 }}
      - --retention={{ $relay.retentionSeconds }}
      {{- if ne $relay.backend "auto" }}
      - --backend={{ $relay.backend }}
      {{- end }}
      - --max-datagram-size={{ $relay.maxDatagramSize }}
      - --http=0.0.0.0:{{ $relay.metricsPort }}
      {{- if .upstream }}
      - --upstream={{ .upstream }}
      - --ca=/tls/ca.crt
      - --upstream-timeout={{ $relay.edges.upstreamTimeout }}
      {{- end }}
    env:
      - {name: KVMOQ_LOG_FORMAT, value: json}
    ports:
      - {name: moqt, containerPort: {{ $relay.port }}, protocol: UDP}
      - {name: metrics, containerPort: {{ $relay.metricsPort }}, protocol: TCP}
    livenessProbe:
      httpGet: {path: /healthz, port: metrics}
    readinessProbe:
      httpGet: {path: /readyz, port: metrics}
    resources: {{- toYaml .resources | nindent 6 }}
    volumeMounts:
      - {name: tls, mountPath: /tls, readOnly: true}
volumes:
  - name: tls
    secret: {secretName: {{ $relay.tlsSecret }}}
{{- end }}

{{- define "kvmoq.injectorSelector" -}}
app.kubernetes.io/name: kvmoq-injector
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The Service of one relay tier: (list $ "root") or (list $ "edge"). */}}
{{- define "kvmoq.relayService" -}}
{{- $ := index . 0 -}}
{{ $.Release.Name }}-relay{{ if eq (index . 1) "edge" }}-edge{{ end }}
{{- end }}

{{/* The names a certificate must cover for a Service, as clients in and out of its
namespace dial it: (list $ SERVICE). YAML list items. */}}
{{- define "kvmoq.serviceDNSNames" -}}
{{- $ := index . 0 -}}
{{- $service := index . 1 -}}
- {{ $service }}
- {{ printf "%s.%s" $service $.Release.Namespace }}
- {{ printf "%s.%s.svc" $service $.Release.Namespace }}
{{- end }}
