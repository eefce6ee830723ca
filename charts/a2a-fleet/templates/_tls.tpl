{{/* TLS for every party (tls.everywhere): the operator, the conversation service and the agent
workloads on the broker's TLS listener, the bundled Mosquitto's plain listener closed. These are
the switches the other templates ask. */}}

{{/* "true" when the bundled Mosquitto serves its TLS listener (8883). */}}
{{- define "a2a-fleet.mosquittoTLS" -}}
{{- if or .Values.mosquitto.tls.enabled .Values.tls.everywhere }}true{{ end -}}
{{- end -}}

{{/* "true" when the bundled Mosquitto serves its plain listener (1883). */}}
{{- define "a2a-fleet.mosquittoPlain" -}}
{{- if not .Values.tls.everywhere }}true{{ end -}}
{{- end -}}

{{/* The Secret whose ca.crt verifies the broker: broker.tls.caSecret, or with tls.everywhere the
bundled Mosquitto's certificate Secret. Empty: the system roots (or no TLS). */}}
{{- define "a2a-fleet.brokerCASecret" -}}
{{- if .Values.broker.tls.caSecret -}}
{{- .Values.broker.tls.caSecret -}}
{{- else if and .Values.tls.everywhere .Values.mosquitto.enabled -}}
{{- .Values.mosquitto.tls.secretName -}}
{{- end -}}
{{- end -}}

{{/* The Secret whose ca.crt the conversation service verifies the broker with: brokerCASecret
when the service's broker URL (the workloads' one) is a TLS URL, else none (a CA file with a
plain URL is refused by the SDK). */}}
{{- define "a2a-fleet.serviceCASecret" -}}
{{- $url := include "a2a-fleet.workloadBrokerURL" . -}}
{{- if or (hasPrefix "tls://" $url) (hasPrefix "mqtts://" $url) (hasPrefix "ssl://" $url) (hasPrefix "wss://" $url) -}}
{{- include "a2a-fleet.brokerCASecret" . -}}
{{- end -}}
{{- end -}}

{{/* The conversation service's TLS settings: the CA file, mounted from serviceCASecret. */}}
{{- define "a2a-fleet.serviceTLSEnv" -}}
{{- if include "a2a-fleet.serviceCASecret" . }}
- name: A2A_TLS_CA_FILE
  value: /etc/a2a-fleet/broker-tls/ca.crt
{{- end }}
{{- end -}}

{{- define "a2a-fleet.serviceTLSVolumeMounts" -}}
{{- if include "a2a-fleet.serviceCASecret" . }}
- name: broker-tls
  mountPath: /etc/a2a-fleet/broker-tls
  readOnly: true
{{- end }}
{{- end -}}

{{- define "a2a-fleet.serviceTLSVolumes" -}}
{{- with include "a2a-fleet.serviceCASecret" . }}
- name: broker-tls
  secret:
    secretName: {{ . }}
    items:
    - key: ca.crt
      path: ca.crt
{{- end }}
{{- end -}}

{{/* With tls.everywhere every broker URL must be a TLS one. */}}
{{- define "a2a-fleet.checkTLSEverywhere" -}}
{{- if .Values.tls.everywhere -}}
{{- range $what, $url := dict "broker.url" .Values.broker.url "broker.workloadURL" .Values.broker.workloadURL -}}
{{- if and $url (not (or (hasPrefix "tls://" $url) (hasPrefix "mqtts://" $url) (hasPrefix "ssl://" $url) (hasPrefix "wss://" $url))) -}}
{{- fail (printf "tls.everywhere: %s %q is not a TLS URL (tls://, mqtts://, wss://)" $what $url) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
