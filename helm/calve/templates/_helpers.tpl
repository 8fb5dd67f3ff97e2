{{- define "calve.labels" -}}
app.kubernetes.io/name: calve
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "calve.selector" -}}
app.kubernetes.io/name: calve
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .role }}
{{- end -}}

{{- define "calve.secretName" -}}
{{- .Values.secrets.existingSecret | default (printf "%s-calve" .Release.Name) -}}
{{- end -}}

{{/* Settings: the ConfigMap's (plain) and the Secret's (credentials) as environment variables. */}}
{{- define "calve.envFrom" -}}
- configMapRef: {name: {{ .Release.Name }}-calve}
- secretRef: {name: {{ include "calve.secretName" . }}}
{{- end -}}

{{/* A role's Deployment: `role` is the command (`calve api|writer|committer`). */}}
{{- define "calve.deployment" -}}
{{- $root := .root -}}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ $root.Release.Name }}-{{ .role }}
  labels:
    {{- include "calve.labels" $root | nindent 4 }}
    app.kubernetes.io/component: {{ .role }}
spec:
  {{- if not (and .values.autoscaling .values.autoscaling.enabled) }}
  replicas: {{ .values.replicas }}
  {{- end }}
  selector:
    matchLabels:
      {{- include "calve.selector" . | nindent 6 }}
  template:
    metadata:
      labels:
        {{- include "calve.selector" . | nindent 8 }}
      annotations:
        checksum/config: {{ include (print $root.Template.BasePath "/config.yaml") $root | sha256sum }}
    spec:
      # SIGTERM: the api stops taking requests and answers those in flight, a writer finishes its
      # batch, a committer commits what it holds; within CALVE_SHUTDOWN_GRACE_S, then 15 s spare.
      terminationGracePeriodSeconds: {{ add $root.Values.shutdownGraceS 15 }}
      securityContext: {runAsNonRoot: true, runAsUser: 10001, runAsGroup: 10001, fsGroup: 10001}
      {{- if eq .role "api" }}
      initContainers:
        - name: migrate
          image: "{{ $root.Values.image.repository }}:{{ $root.Values.image.tag }}"
          imagePullPolicy: {{ $root.Values.image.pullPolicy }}
          command: ["calve", "migrate"]
          envFrom:
            {{- include "calve.envFrom" $root | nindent 12 }}
          securityContext: {allowPrivilegeEscalation: false, readOnlyRootFilesystem: true, capabilities: {drop: [ALL]}}
          volumeMounts: [{name: data, mountPath: /var/lib/calve}]
      {{- end }}
      containers:
        - name: {{ .role }}
          image: "{{ $root.Values.image.repository }}:{{ $root.Values.image.tag }}"
          imagePullPolicy: {{ $root.Values.image.pullPolicy }}
          command: ["calve", {{ .role | quote }}]
          envFrom:
            {{- include "calve.envFrom" $root | nindent 12 }}
          resources:
            {{- toYaml .values.resources | nindent 12 }}
          securityContext: {allowPrivilegeEscalation: false, readOnlyRootFilesystem: true, capabilities: {drop: [ALL]}}
          volumeMounts: [{name: data, mountPath: /var/lib/calve}]
          {{- if eq .role "api" }}
          ports: [{name: http, containerPort: {{ .values.port }}}]
          readinessProbe: {httpGet: {path: /readyz, port: http}, periodSeconds: 5, failureThreshold: 2}
          livenessProbe: {httpGet: {path: /healthz, port: http}, periodSeconds: 10, failureThreshold: 6}
          lifecycle:
            # Endpoints drop the pod a moment after SIGTERM is sent: keep taking requests meanwhile.
            preStop: {sleep: {seconds: 5}}
          {{- else }}
          # Writers and committers answer only /metrics: these probes see a process that serves,
          # not a loop that progresses (the calve_role_alive heartbeat alert does that).
          ports: [{name: metrics, containerPort: {{ $root.Values.metricsPort }}}]
          readinessProbe: {httpGet: {path: /metrics, port: metrics}, periodSeconds: 10}
          livenessProbe: {httpGet: {path: /metrics, port: metrics}, periodSeconds: 20, failureThreshold: 6}
          {{- end }}
      volumes: [{name: data, emptyDir: {sizeLimit: 1Gi}}]
{{- end -}}

{{- define "calve.pdb" -}}
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ .root.Release.Name }}-{{ .role }}
  labels:
    {{- include "calve.labels" .root | nindent 4 }}
spec:
  maxUnavailable: {{ .values.podDisruptionBudget.maxUnavailable }}
  selector:
    matchLabels:
      {{- include "calve.selector" . | nindent 6 }}
{{- end -}}

{{- define "calve.hpa" -}}
{{- if and .values.autoscaling .values.autoscaling.enabled }}
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata:
  name: {{ .root.Release.Name }}-{{ .role }}
  labels:
    {{- include "calve.labels" .root | nindent 4 }}
spec:
  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: {{ .root.Release.Name }}-{{ .role }}}
  minReplicas: {{ .values.autoscaling.minReplicas }}
  maxReplicas: {{ .values.autoscaling.maxReplicas }}
  metrics:
    - type: Resource
      resource: {name: cpu, target: {type: Utilization, averageUtilization: {{ .values.autoscaling.targetCPUUtilizationPercentage }}}}
{{- end }}
{{- end -}}
