{{- define "sim-workload.name" -}}
app.kubernetes.io/name: sim-workload
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "sim-workload.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 1000
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{- define "sim-workload.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
{{- end }}
