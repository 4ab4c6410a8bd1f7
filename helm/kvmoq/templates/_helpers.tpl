{{- define "kvmoq.inferenceName" -}}
{{ .Values.inference.name | default (printf "%s-inference" .Release.Name) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "kvmoq.inferenceSelector" -}}
app.kubernetes.io/name: kvmoq-inference
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}
