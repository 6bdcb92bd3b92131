{{- define "library-chart.hello" -}}hello{{- end }}
