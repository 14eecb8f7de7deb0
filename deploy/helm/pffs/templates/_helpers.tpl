{{- define "pffs.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "pffs.labels" -}}
app.kubernetes.io/name: pffs
{{- end -}}

{{- define "pffs.socketDir" -}}
{{ .Values.kubeletDir }}/plugins/{{ .Values.driverName }}
{{- end -}}
