#!/bin/sh
# api-lb (docker-compose.yml): nginx in front of the linkdb-api replicas.
# nginx resolves names at request time only through a `resolver`, so the
# container's own name server (the compose network's DNS: 127.0.0.11 under
# Docker, the network's gateway under podman) goes into the configuration.
set -eu
ns=$(awk '/^nameserver/ { print $2; exit }' /etc/resolv.conf)
[ -n "$ns" ] || { echo "api-lb: no nameserver in /etc/resolv.conf" >&2; exit 1; }
case $ns in *:*) ns="[$ns]" ;; esac
sed "s/@RESOLVER@/$ns/" /etc/polycorn/nginx.conf.in >/tmp/nginx.conf
exec nginx -c /tmp/nginx.conf -g 'daemon off;'
