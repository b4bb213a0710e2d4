{{- define "redlockd.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "redlockd.fullname" -}}
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

{{- define "redlockd.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "redlockd.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "redlockd.selectorLabels" -}}
app.kubernetes.io/name: {{ include "redlockd.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: server
{{- end }}

{{- define "redlockd.redisSelectorLabels" -}}
app.kubernetes.io/name: {{ include "redlockd.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: redis-master
{{- end }}

{{/* The Secret that holds REDLOCKD_REDIS_URLS, and its key. */}}
{{- define "redlockd.redisSecret" -}}
{{- .Values.redis.existingSecret | default (printf "%s-redis" (include "redlockd.fullname" .)) }}
{{- end }}

{{- define "redlockd.redisSecretKey" -}}
{{- if .Values.redis.existingSecret }}{{ .Values.redis.existingSecretKey }}{{ else }}redis-urls{{ end }}
{{- end }}

{{/* The URLs of the masters the chart deploys: one per StatefulSet pod, by stable DNS name. */}}
{{- define "redlockd.deployedRedisUrls" -}}
{{- $fullname := include "redlockd.fullname" . -}}
{{- $urls := list -}}
{{- range $i := until (int .Values.redis.deploy.masters) -}}
{{- $urls = append $urls (printf "redis://%s-redis-%d.%s-redis.%s.svc:6379" $fullname $i $fullname $.Release.Namespace) -}}
{{- end -}}
{{- join "," $urls -}}
{{- end }}
