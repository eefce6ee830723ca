{{/* Name prefix of every object: the chart name, as config/ uses (a2a-fleet-...). */}}
{{- define "a2a-fleet.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{- define "a2a-fleet.labels" -}}
app.kubernetes.io/part-of: a2a-fleet
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* The broker the operator administers: the bundled Mosquitto unless broker.url is set. */}}
{{- define "a2a-fleet.brokerURL" -}}
{{- if .Values.broker.url -}}
{{- .Values.broker.url -}}
{{- else if and .Values.mosquitto.enabled .Values.tls.everywhere -}}
tls://{{ include "a2a-fleet.name" . }}-mosquitto.{{ .Release.Namespace }}.svc:8883
{{- else if .Values.mosquitto.enabled -}}
mqtt://{{ include "a2a-fleet.name" . }}-mosquitto.{{ .Release.Namespace }}.svc:1883
{{- else -}}
{{- fail "set broker.url, or mosquitto.enabled=true for the bundled broker" -}}
{{- end -}}
{{- end -}}

{{/* How the operator keeps identities and ACLs on the broker: table or dynsec. */}}
{{- define "a2a-fleet.brokerBackend" -}}
{{- $b := .Values.broker.backend -}}
{{- if not (has $b (list "table" "dynsec")) -}}
{{- fail (printf "broker.backend is %q: table or dynsec" $b) -}}
{{- end -}}
{{- $b -}}
{{- end -}}

{{- define "a2a-fleet.workloadBrokerURL" -}}
{{- default (include "a2a-fleet.brokerURL" .) .Values.broker.workloadURL -}}
{{- end -}}

{{- define "a2a-fleet.serviceSecret" -}}
{{ include "a2a-fleet.name" . }}-conversation-service-credentials
{{- end -}}

{{- define "a2a-fleet.tracingEnv" -}}
{{- if .Values.tracing.otlpEndpoint }}
- name: OTEL_TRACES_EXPORTER
  value: otlp
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ .Values.tracing.otlpEndpoint | quote }}
{{- end }}
{{- end -}}

{{/* The conversation service's --store: the Sentinel set of conversationService.redis when its
addresses are set, else conversationService.store. */}}
{{- define "a2a-fleet.conversationStore" -}}
{{- $r := .Values.conversationService.redis -}}
{{- with $r.sentinel.addresses -}}
{{ ternary "rediss" "redis" $r.tls }}+sentinel://{{ first . }}/{{ $r.db }}?master_name={{ required "conversationService.redis.sentinel.masterName" $r.sentinel.masterName | urlquery }}
{{- range rest . }}&addr={{ . }}{{ end -}}
&wait_replicas={{ $r.sentinel.waitReplicas }}&wait_timeout={{ $r.sentinel.waitTimeout }}
{{- else -}}
{{ .Values.conversationService.store }}
{{- end -}}
{{- end -}}

{{/* "true" when the service's bbolt store is on a claim: persistence on and the store a bolt: file. */}}
{{- define "a2a-fleet.serviceStateClaim" -}}
{{- $s := .Values.conversationService -}}
{{- if and $s.persistence.enabled (not $s.redis.sentinel.addresses) (hasPrefix "bolt:" $s.store) -}}
true
{{- end -}}
{{- end -}}
