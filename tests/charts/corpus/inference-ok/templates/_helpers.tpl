{{- define "inference-test.labels" -}}
app.kubernetes.io/name: inference-test
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "inference-test.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 1000
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{- define "inference-test.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
{{- end }}

{{- define "inference-test.resources" -}}
limits:
  cpu: "1"
  memory: 1Gi
{{- end }}
