#!/usr/bin/env bash
# server.properties from KAFKA_* variables (apache/kafka's convention), the
# storage formatted once with CLUSTER_ID, then the broker in the foreground.
set -euo pipefail
conf=/opt/kafka/config/server.properties
: >"$conf"
while IFS= read -r var; do
    case $var in
        KAFKA_HEAP_OPTS | KAFKA_OPTS | KAFKA_JVM_PERFORMANCE_OPTS | KAFKA_LOG4J_OPTS | KAFKA_VERSION) continue ;;
    esac
    key=${var#KAFKA_}
    key=${key,,}
    key=${key//___/-}
    key=${key//__/@}
    key=${key//_/.}
    key=${key//@/_}
    printf '%s=%s\n' "$key" "${!var}" >>"$conf"
done < <(compgen -e | grep '^KAFKA_' | sort)
logdirs=$(sed -n 's/^log\.dirs=//p' "$conf")
[[ -n $logdirs ]] || { echo "kafka: set KAFKA_LOG_DIRS" >&2; exit 2; }
cp=(-cp '/opt/kafka/libs/*')
log=(-Dlog4j2.configurationFile=/opt/kafka/config/log4j2.properties)
if [[ ! -e ${logdirs%%,*}/meta.properties ]]; then
    java "${log[@]}" "${cp[@]}" kafka.tools.StorageTool format --ignore-formatted \
        -t "${CLUSTER_ID:-$(java "${cp[@]}" kafka.tools.StorageTool random-uuid)}" -c "$conf"
fi
# shellcheck disable=SC2086  # KAFKA_HEAP_OPTS is a list of JVM flags
exec java ${KAFKA_HEAP_OPTS:--Xms256m -Xmx512m} -XX:+UseG1GC "${log[@]}" "${cp[@]}" kafka.Kafka "$conf"
