{{/*
Names, labels and the pieces every template shares.
*/}}

{{- define "polycorn.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The prefix of every object name. Kept at 20 characters at most so that
"<fullname>-proxy-<train id>" (train ids are at most 24 characters, see
values.schema.json) stays within the 52 characters a StatefulSet name may
have (its pods get a controller-revision-hash label of name + 11 characters).
*/}}
{{- define "polycorn.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 20 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 20 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 20 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "polycorn.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of every object; call with (dict "ctx" $ "component" "proxy"). */}}
{{- define "polycorn.labels" -}}
helm.sh/chart: {{ include "polycorn.chart" .ctx }}
{{ include "polycorn.selectorLabels" . }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
app.kubernetes.io/part-of: polycorn
{{- with .ctx.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Selector labels; call with (dict "ctx" $ "component" "proxy"). */}}
{{- define "polycorn.selectorLabels" -}}
app.kubernetes.io/name: {{ include "polycorn.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* The selector of one train's proxy pod; call with (dict "ctx" $ "train" $t). */}}
{{- define "polycorn.proxySelectorLabels" -}}
{{ include "polycorn.selectorLabels" (dict "ctx" .ctx "component" "proxy") }}
polycorn.io/train: {{ .train.id }}
{{- end }}

{{- define "polycorn.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "polycorn.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* "repository:tag", the tag defaulting to appVersion; call with (dict "ctx" $ "image" .Values.x.image). */}}
{{- define "polycorn.image" -}}
{{- printf "%s:%s" .image.repository (default .ctx.Chart.AppVersion .image.tag) }}
{{- end }}

{{/* Name of one train's proxy StatefulSet and headless Service. */}}
{{- define "polycorn.proxyName" -}}
{{- printf "%s-proxy-%s" (include "polycorn.fullname" .ctx) .train.id }}
{{- end }}

{{/* The TLS server names Envoy routes to a train's proxy, as a list. */}}
{{- define "polycorn.trainServerNames" -}}
{{- if .train.serverNames }}
{{- toJson .train.serverNames }}
{{- else }}
{{- toJson (list (printf "%s.%s" .train.id .ctx.Values.envoy.trains.serverNameSuffix)) }}
{{- end }}
{{- end }}

{{- define "polycorn.trainTlsSecret" -}}
{{- default (printf "%s-tls" (include "polycorn.proxyName" .)) .train.tlsSecret }}
{{- end }}

{{/* The Envoy cluster of one train. */}}
{{- define "polycorn.trainCluster" -}}
{{- printf "train_%s" .train.id }}
{{- end }}

{{/* The UDP port of a train's QUIC at Envoy (quic.enabled): trains[].quicPort;
in "port" routing it defaults to the train's edgePort, so that a relay finds
TCP and UDP at one port of the edge. Empty when there is none. Call with
(dict "ctx" $ "train" $t). */}}
{{- define "polycorn.trainQuicPort" -}}
{{- if .train.quicPort }}
{{- .train.quicPort }}
{{- else if and (eq .ctx.Values.envoy.trains.routing "port") .train.edgePort }}
{{- .train.edgePort }}
{{- end }}
{{- end }}

{{/* Envoy's UDP listener and cluster of one train's QUIC. */}}
{{- define "polycorn.trainQuicCluster" -}}
{{- printf "train_%s_quic" .train.id }}
{{- end }}

{{- define "polycorn.kafkaBootstrap" -}}
{{- required "kafka.bootstrap is required: the Kafka bootstrap servers, host:port[,host:port...]" .Values.kafka.bootstrap }}
{{- end }}

{{/* POLYCORN_DATABASE_URL of one component from its own Secret (its own
LinkDB login, postgresql.users); libpq's PGSSLMODE and PGSSLROOTCERT (an
sslmode or sslrootcert in the URL wins). Call with (dict "ctx" $ "c"
"migrations"|"ingest"|"linkdbApi"|"trainer"). */}}
{{- define "polycorn.databaseEnv" -}}
{{- $u := index .ctx.Values.postgresql.users .c }}
- name: POLYCORN_DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ required (printf "postgresql.users.%s.secret is required: a Secret holding the %s's LinkDB URL, postgresql://LOGIN:PASSWORD@HOST:5432/linkdb, with a login of its own (docs/operations.md, \"LinkDB roles\")" .c .c) $u.secret }}
      key: {{ $u.key }}
- name: PGSSLMODE
  value: {{ .ctx.Values.postgresql.sslmode }}
{{- if .ctx.Values.postgresql.caSecret.name }}
- name: PGSSLROOTCERT
  value: /etc/polycorn/postgresql-ca/ca.crt
{{- end }}
{{- end }}

{{/* The PostgreSQL CA's mount and volume (with postgresql.caSecret.name). */}}
{{- define "polycorn.databaseVolumeMounts" -}}
{{- if .Values.postgresql.caSecret.name }}
- name: postgresql-ca
  mountPath: /etc/polycorn/postgresql-ca
  readOnly: true
{{- end }}
{{- end }}

{{- define "polycorn.databaseVolumes" -}}
{{- with .Values.postgresql.caSecret }}
{{- if .name }}
- name: postgresql-ca
  secret:
    secretName: {{ .name }}
    items:
      - key: {{ .key }}
        path: ca.crt
{{- end }}
{{- end }}
{{- end }}

{{/* Kafka security of one component as environment variables (the
proxy's POLYCORN_PROXY_KAFKA_*, the Python services' POLYCORN_KAFKA_*): the
protocol, the SCRAM user name from its Secret, the files mounted by
polycorn.kafkaVolumes. Call with (dict "ctx" $ "c" "proxy"|"ingest"|"trainer"). */}}
{{- define "polycorn.kafkaEnv" -}}
{{- $s := .ctx.Values.kafka.security }}
{{- $u := index $s.users .c }}
{{- $env := ternary "POLYCORN_PROXY_KAFKA_" "POLYCORN_KAFKA_" (eq .c "proxy") -}}
- name: {{ $env }}SECURITY_PROTOCOL
  value: {{ $s.protocol }}
{{- if hasPrefix "SASL_" $s.protocol }}
- name: {{ $env }}SASL_MECHANISM
  value: {{ $s.saslMechanism }}
- name: {{ $env }}SASL_USERNAME
  valueFrom:
    secretKeyRef:
      name: {{ required (printf "kafka.security.users.%s.secret is required with kafka.security.protocol %s: a Secret with the %s's SCRAM user (keys username and password)" .c $s.protocol .c) $u.secret }}
      key: username
- name: {{ $env }}SASL_PASSWORD_FILE
  value: /etc/polycorn/kafka/password
{{- end }}
{{- if hasSuffix "SSL" $s.protocol }}
{{- if $s.caSecret.name }}
- name: {{ $env }}SSL_CA
  value: /etc/polycorn/kafka-ca/ca.crt
{{- end }}
{{- if $u.tlsSecret }}
- name: {{ $env }}SSL_CERT
  value: /etc/polycorn/kafka-tls/tls.crt
- name: {{ $env }}SSL_KEY
  value: /etc/polycorn/kafka-tls/tls.key
{{- end }}
{{- end }}
{{- end }}

{{- define "polycorn.kafkaVolumeMounts" -}}
{{- $s := .ctx.Values.kafka.security }}
{{- $u := index $s.users .c }}
{{- if hasPrefix "SASL_" $s.protocol }}
- name: kafka-credentials
  mountPath: /etc/polycorn/kafka
  readOnly: true
{{- end }}
{{- if and (hasSuffix "SSL" $s.protocol) $s.caSecret.name }}
- name: kafka-ca
  mountPath: /etc/polycorn/kafka-ca
  readOnly: true
{{- end }}
{{- if and (hasSuffix "SSL" $s.protocol) $u.tlsSecret }}
- name: kafka-tls
  mountPath: /etc/polycorn/kafka-tls
  readOnly: true
{{- end }}
{{- end }}

{{- define "polycorn.kafkaVolumes" -}}
{{- $s := .ctx.Values.kafka.security }}
{{- $u := index $s.users .c }}
{{- if hasPrefix "SASL_" $s.protocol }}
- name: kafka-credentials
  secret:
    secretName: {{ $u.secret }}
    defaultMode: 0440
    items:
      - key: password
        path: password
{{- end }}
{{- if and (hasSuffix "SSL" $s.protocol) $s.caSecret.name }}
- name: kafka-ca
  secret:
    secretName: {{ $s.caSecret.name }}
    items:
      - key: {{ $s.caSecret.key }}
        path: ca.crt
{{- end }}
{{- if and (hasSuffix "SSL" $s.protocol) $u.tlsSecret }}
- name: kafka-tls
  secret:
    secretName: {{ $u.tlsSecret }}
    defaultMode: 0440
    items:
      - key: tls.crt
        path: tls.crt
      - key: tls.key
        path: tls.key
{{- end }}
{{- end }}

{{- define "polycorn.podSecurityContext" -}}
{{- toYaml .Values.podSecurityContext }}
{{- end }}

{{- define "polycorn.containerSecurityContext" -}}
{{- toYaml .Values.containerSecurityContext }}
{{- end }}

{{/* Scheduling and pull secrets of a pod; call with (dict "ctx" $ "c" .Values.component). */}}
{{- define "polycorn.podPlacement" -}}
{{- with .ctx.Values.imagePullSecrets }}
imagePullSecrets:
{{- range . }}
  - name: {{ . }}
{{- end }}
{{- end }}
{{- with .c.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .c.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .c.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* A PodDisruptionBudget (policy/v1) of one component's pods, when its
podDisruptionBudget.enabled; call with (dict "ctx" $ "component" "ingest" "pdb" .Values.ingest.podDisruptionBudget). */}}
{{- define "polycorn.podDisruptionBudget" -}}
{{- if .pdb.enabled }}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ include "polycorn.fullname" .ctx }}-{{ .component }}
  namespace: {{ .ctx.Release.Namespace }}
  labels:
    {{- include "polycorn.labels" (dict "ctx" .ctx "component" .component) | nindent 4 }}
spec:
  maxUnavailable: {{ .pdb.maxUnavailable }}
  selector:
    matchLabels:
      {{- include "polycorn.selectorLabels" (dict "ctx" .ctx "component" .component) | nindent 6 }}
{{- end }}
{{- end }}

{{/* The linkdb-api Service's in-cluster URL. */}}
{{- define "polycorn.linkdbApiUrl" -}}
{{- printf "http://%s-linkdb-api.%s.svc.%s:%d" (include "polycorn.fullname" .) .Release.Namespace .Values.clusterDomain (int .Values.linkdbApi.port) }}
{{- end }}

{{/* The ConfigMap of the proxies' table verify key(s) (tableSigning). */}}
{{- define "polycorn.tableVerifyKeysName" -}}
{{- printf "%s-table-verify-keys" (include "polycorn.fullname" .) }}
{{- end }}

{{/* tableSigning.verifyKeys, checked: one or more PUBLIC KEY blocks and
nothing that looks like a private key (the public half is a value, the
private half never is). Fails the render otherwise. */}}
{{- define "polycorn.tableVerifyKeys" -}}
{{- $s := .Values.tableSigning }}
{{- $keys := trim $s.verifyKeys }}
{{- if not $keys }}
{{- fail "tableSigning.verifyKeys is required with tableSigning.enabled: the PEM text of table-signing.pub from `polycorn-pki table-key` (helm --set-file tableSigning.verifyKeys=DIR/table-signing.pub; docs/operations.md, \"The failure-table signing key\"), or set tableSigning.enabled=false to publish and accept unsigned tables" }}
{{- end }}
{{- if contains "PRIVATE KEY" $keys }}
{{- fail "tableSigning.verifyKeys holds a PRIVATE KEY: give the proxies the public key (table-signing.pub) only; the private key belongs in the Secret tableSigning.signingKeySecret and must be replaced, since it is now in your values" }}
{{- end }}
{{- $begins := regexFindAll "-----BEGIN [A-Z0-9 ]+-----" $keys -1 }}
{{- if not $begins }}
{{- fail "tableSigning.verifyKeys has no PEM block: give the PEM text of table-signing.pub (-----BEGIN PUBLIC KEY----- ...)" }}
{{- end }}
{{- range $begins }}
{{- if ne . "-----BEGIN PUBLIC KEY-----" }}
{{- fail (printf "tableSigning.verifyKeys: %s is not a PUBLIC KEY block; only the public keys of `polycorn-pki table-key` (table-signing.pub) go there" .) }}
{{- end }}
{{- end }}
{{- if ne (len $begins) (len (regexFindAll "-----END PUBLIC KEY-----" $keys -1)) }}
{{- fail "tableSigning.verifyKeys: a PUBLIC KEY block has no END line" }}
{{- end }}
{{- $keys }}
{{- end }}

{{/* The trainer's signing key: its required Secret name. */}}
{{- define "polycorn.tableSigningSecret" -}}
{{- required "tableSigning.signingKeySecret.name is required with tableSigning.enabled: a Secret with the trainer's table-signing.key from `polycorn-pki table-key` (kubectl create secret generic NAME --from-file=table-signing.key=DIR/table-signing.key; docs/operations.md, \"The failure-table signing key\"), or set tableSigning.enabled=false to publish and accept unsigned tables" .Values.tableSigning.signingKeySecret.name }}
{{- end }}

{{/*
Checks across values that the schema cannot express; rendered once, from
NOTES.txt and from the Envoy ConfigMap, so that `helm template` fails too.
*/}}
{{- define "polycorn.validate" -}}
{{- $seen := dict }}
{{- $names := dict }}
{{- $ports := dict }}
{{- $udpPorts := dict }}
{{- range .Values.trains }}
{{- if hasKey $seen .id }}
{{- fail (printf "trains: train id %q is listed twice" .id) }}
{{- end }}
{{- $_ := set $seen .id true }}
{{- $t := . }}
{{- range (include "polycorn.trainServerNames" (dict "ctx" $ "train" .) | fromJsonArray) }}
{{- if hasKey $names . }}
{{- fail (printf "trains: server name %q is used by two trains (%s and %s)" . (get $names .) $t.id) }}
{{- end }}
{{- $_ := set $names . $t.id }}
{{- end }}
{{- if eq $.Values.envoy.trains.routing "port" }}
{{- if not .edgePort }}
{{- fail (printf "trains: train %q needs an edgePort with envoy.trains.routing=port" .id) }}
{{- end }}
{{- $p := toString .edgePort }}
{{- if or (hasKey $ports $p) (eq (int .edgePort) (int $.Values.envoy.api.port)) (eq (int .edgePort) (int $.Values.envoy.api.containerPort)) (eq (int .edgePort) (int $.Values.envoy.statsPort)) (eq (int .edgePort) (int $.Values.envoy.adminPort)) }}
{{- fail (printf "trains: edgePort %v of train %q is used twice" .edgePort .id) }}
{{- end }}
{{- $_ := set $ports $p true }}
{{- end }}
{{- if and $.Values.quic.enabled $.Values.envoy.enabled }}
{{- $q := include "polycorn.trainQuicPort" (dict "ctx" $ "train" .) }}
{{- if not $q }}
{{- fail (printf "trains: train %q needs a quicPort with quic.enabled: the UDP port at Envoy that its QUIC is routed by (QUIC cannot be routed by server name)" .id) }}
{{- end }}
{{- if hasKey $udpPorts $q }}
{{- fail (printf "trains: quicPort %s of train %q is also train %q's: each train needs a UDP port of its own" $q .id (get $udpPorts $q)) }}
{{- end }}
{{- $_ := set $udpPorts $q .id }}
{{- end }}
{{- end }}
{{- if .Values.quic.enabled }}
{{- $idle := .Values.quic.sessionIdleTimeout | trimSuffix "s" | float64 }}
{{- if le $idle 30.0 }}
{{- fail (printf "quic.sessionIdleTimeout %s must be more than 30s, the relays' QUIC idle timeout: a connection silent through an outage would lose its Envoy session while both ends still hold it" .Values.quic.sessionIdleTimeout) }}
{{- end }}
{{- end }}
{{- $dbSecrets := dict }}
{{- range $c, $u := .Values.postgresql.users }}
{{- if and $u.secret (or (ne $c "migrations") $.Values.migrations.enabled) }}
{{- $k := printf "%s/%s" $u.secret $u.key }}
{{- if hasKey $dbSecrets $k }}
{{- fail (printf "postgresql.users.%s and postgresql.users.%s name the same Secret key %s: each component logs in to LinkDB as its own role (only the trainer may write failure tables), so each needs a URL of its own" (get $dbSecrets $k) $c $k) }}
{{- end }}
{{- $_ := set $dbSecrets $k $c }}
{{- end }}
{{- end }}
{{- if and (has .Values.postgresql.sslmode (list "verify-ca" "verify-full")) (not .Values.postgresql.caSecret.name) }}
{{- fail (printf "postgresql.caSecret.name is required with postgresql.sslmode %s: a Secret with the CA certificate of the PostgreSQL server" .Values.postgresql.sslmode) }}
{{- end }}
{{- with .Values.metrics.grafana.linkdbDatasource }}
{{- if and .enabled (has .sslmode (list "verify-ca" "verify-full")) (not .caCertPath) }}
{{- fail (printf "metrics.grafana.linkdbDatasource.caCertPath is required with sslmode %s: the path, in Grafana's container, of the CA certificate of LinkDB's server" .sslmode) }}
{{- end }}
{{- end }}
{{- range $c, $u := .Values.kafka.security.users }}
{{- if and $u.tlsSecret (not (hasSuffix "SSL" $.Values.kafka.security.protocol)) }}
{{- fail (printf "kafka.security.users.%s.tlsSecret needs kafka.security.protocol SSL or SASL_SSL" $c) }}
{{- end }}
{{- end }}
{{- if .Values.tableSigning.enabled }}
{{- $_ := include "polycorn.tableSigningSecret" . }}
{{- $_ := include "polycorn.tableVerifyKeys" . }}
{{- end }}
{{- if and .Values.trains (not .Values.proxy.caSecret.name) }}
{{- fail "proxy.caSecret.name is required: a Secret with the CA certificate that signs the train certificates" }}
{{- end }}
{{- if and .Values.envoy.enabled .Values.envoy.api.enabled (not .Values.envoy.api.tlsSecret) }}
{{- fail "envoy.api.tlsSecret is required with envoy.api.enabled: a kubernetes.io/tls Secret with the API's certificate" }}
{{- end }}
{{- with .Values.proxy.flowControl }}
{{- if gt (int64 .connWindowInitial) (int64 .connWindow) }}
{{- fail (printf "proxy.flowControl.connWindowInitial (%d) must be at most proxy.flowControl.connWindow (%d)" (int64 .connWindowInitial) (int64 .connWindow)) }}
{{- end }}
{{- end }}
{{- if and .Values.proxy.failureTable.api.enabled (not .Values.proxy.failureTable.api.apiKeySecret) }}
{{- fail "proxy.failureTable.api.apiKeySecret is required with proxy.failureTable.api.enabled" }}
{{- end }}
{{- with .Values.proxy.failureTable.api }}
{{- if and .enabled (hasPrefix "http://" (default (include "polycorn.linkdbApiUrl" $) .url)) (not .insecureHttp) }}
{{- fail (printf "proxy.failureTable.api: the proxies would send their API key in clear text to %s; set proxy.failureTable.api.url to an https:// URL (the Envoy edge), or set proxy.failureTable.api.insecureHttp=true to accept plain http inside the cluster (values.yaml says when that is acceptable)" (default (include "polycorn.linkdbApiUrl" $) .url)) }}
{{- end }}
{{- end }}
{{- if and .Values.envoy.enabled (eq .Values.envoy.trains.routing "sni") (or (eq (int .Values.envoy.trains.port) (int .Values.envoy.api.port)) (eq (int .Values.envoy.trains.port) (int .Values.envoy.api.containerPort)) (eq (int .Values.envoy.trains.port) (int .Values.envoy.statsPort)) (eq (int .Values.envoy.trains.port) (int .Values.envoy.adminPort))) }}
{{- fail "envoy.trains.port must differ from envoy.api.port, envoy.api.containerPort, envoy.statsPort and envoy.adminPort" }}
{{- end }}
{{- end }}
