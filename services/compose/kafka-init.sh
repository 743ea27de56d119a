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
    # Retried: the compose network's DNS can miss a query while containers
    # join it.
    for try in 1 2 3 4 5; do
        /opt/kafka/bin/kafka-topics.sh "${args[@]}" && break
        ((try < 5)) || exit 1
        sleep 2
    done
done <"$topics"
/opt/kafka/bin/kafka-topics.sh --bootstrap-server "$bootstrap" --list
