{{/* The release's full name, at most 63 characters (a DNS label). */}}
{{- define "nvcf-server.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "nvcf-server.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "nvcf-server.labels" -}}
{{ include "nvcf-server.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "nvcf-server.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "nvcf-server.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The Secret holding the secrets key and the bootstrap key. */}}
{{- define "nvcf-server.keysSecretName" -}}
{{- default (include "nvcf-server.fullname" .) .Values.secrets.existingSecret -}}
{{- end -}}

{{/* The database URL, checked: a clear message instead of a pod that crash-loops. */}}
{{- define "nvcf-server.databaseUrl" -}}
{{- $url := .Values.database.url | default "" | trim -}}
{{- if not $url -}}
{{- fail "database.url is required: the URL of an external PostgreSQL database, e.g. --set database.url=postgresql+psycopg://nvcf:PASSWORD@postgres.example:5432/nvcf" -}}
{{- end -}}
{{- if not (hasPrefix "postgresql" $url) -}}
{{- fail (printf "database.url must be a PostgreSQL URL (postgresql+psycopg://user:password@host:5432/database), not %q: replicas share one database" (regexReplaceAll "//[^@/]*@" $url "//***@")) -}}
{{- end -}}
{{- $url -}}
{{- end -}}
