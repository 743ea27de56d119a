#!/usr/bin/env bash
# kafka-topics.sh / kafka-broker-api-versions.sh, as in the official image.
set -euo pipefail
case $(basename "$0") in
    kafka-topics.sh) cls=org.apache.kafka.tools.TopicCommand ;;
    kafka-broker-api-versions.sh) cls=org.apache.kafka.tools.BrokerApiVersionsCommand ;;
    *) echo "unknown tool $0" >&2; exit 2 ;;
esac
exec java -Xmx128m -XX:TieredStopAtLevel=1 -Dlog4j2.configurationFile=/opt/kafka/config/log4j2.properties \
    -cp '/opt/kafka/libs/*' "$cls" "$@"
