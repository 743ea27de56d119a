#!/usr/bin/env bash
# kafka-init (docker-compose.yml): create the topics of services/kafka/topics.txt
# (`name partitions config...`) on BOOTSTRAP, idempotently.
#   kafka-init.sh BOOTSTRAP TOPICS_FILE
set -euo pipefail
bootstrap=$1 topics=$2
while read -r name parts configs; do
    [[ -z $name || $name == \#* ]] && continue
    args=(--bootstrap-server "$bootstrap" --create --if-not-exists --topic "$name" --partitions "$parts" --replication-factor 1)
    for c in $configs; do args+=(--config "$c"); done
    /opt/kafka/bin/kafka-topics.sh "${args[@]}"
done <"$topics"
/opt/kafka/bin/kafka-topics.sh --bootstrap-server "$bootstrap" --list
