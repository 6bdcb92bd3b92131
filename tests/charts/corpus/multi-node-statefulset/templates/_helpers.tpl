{{- define "multi-node-test.selector" -}}
app.kubernetes.io/name: multi-node-test
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}
