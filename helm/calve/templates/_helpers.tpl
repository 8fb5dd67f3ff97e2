{{- define "calve.env" -}}
- {name: CALVE_HOST, value: "0.0.0.0"}
- {name: CALVE_REDIS_URL, value: {{ .Values.external.redisUrl | quote }}}
- {name: CALVE_SPARK_REMOTE, value: {{ .Values.external.sparkRemote | quote }}}
- {name: CALVE_CATALOG_URI, value: {{ .Values.external.catalogUri | quote }}}
- {name: CALVE_WAREHOUSE, value: {{ .Values.external.warehouse | quote }}}
- {name: CALVE_DATABASE_URL, value: {{ .Values.external.databaseUrl | quote }}}
- {name: CALVE_COMMIT_INTERVAL_S, value: {{ .Values.config.commitIntervalS | quote }}}
- {name: CALVE_LEASE_S, value: {{ .Values.config.leaseS | quote }}}
- {name: CALVE_MAX_BODY_BYTES, value: {{ .Values.config.maxBodyBytes | quote }}}
- {name: CALVE_DATA_DIR, value: "/tmp/calve"}
{{- if .Values.external.bootstrapTokenSecret }}
- name: CALVE_BOOTSTRAP_TOKEN
  valueFrom: {secretKeyRef: {name: {{ .Values.external.bootstrapTokenSecret }}, key: CALVE_BOOTSTRAP_TOKEN}}
{{- end }}
{{- end -}}

{{- define "calve.role" -}}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ .root.Release.Name }}-{{ .role }}
  labels: {app.kubernetes.io/name: calve, app.kubernetes.io/component: {{ .role }}}
spec:
  replicas: {{ .values.replicas }}
  selector:
    matchLabels: {app.kubernetes.io/name: calve, app.kubernetes.io/component: {{ .role }}, app.kubernetes.io/instance: {{ .root.Release.Name }}}
  template:
    metadata:
      labels: {app.kubernetes.io/name: calve, app.kubernetes.io/component: {{ .role }}, app.kubernetes.io/instance: {{ .root.Release.Name }}}
    spec:
      terminationGracePeriodSeconds: 40
      {{- if eq .role "api" }}
      initContainers:
        - name: migrate
          image: "{{ .root.Values.image.repository }}:{{ .root.Values.image.tag }}"
          command: ["calve", "migrate"]
          env:
            {{- include "calve.env" .root | nindent 12 }}
      {{- end }}
      containers:
        - name: {{ .role }}
          image: "{{ .root.Values.image.repository }}:{{ .root.Values.image.tag }}"
          imagePullPolicy: {{ .root.Values.image.pullPolicy }}
          command: ["calve", "{{ .role }}"]
          env:
            {{- include "calve.env" .root | nindent 12 }}
          resources: {{- toYaml .values.resources | nindent 12 }}
          {{- if eq .role "api" }}
          ports: [{name: http, containerPort: {{ .values.port }}}]
          readinessProbe: {httpGet: {path: /readyz, port: http}, periodSeconds: 10}
          livenessProbe: {httpGet: {path: /healthz, port: http}, periodSeconds: 10}
          {{- end }}
{{- end -}}
