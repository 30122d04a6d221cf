#!/bin/sh
# Starts one Redis Sentinel of the replicated Redis (components/redis-sentinel, and
# deploy/compose/redis-ha.yml), watching the primary the other sentinels or the nodes report.
#
#   sh sentinel.sh [redis-server options...]
#
# Environment:
#   REDIS_HA_SELF           this sentinel's name, as the others reach it
#   REDIS_HA_NODES          the data nodes, HOST:PORT separated by blanks
#   REDIS_HA_SENTINELS      the sentinels (this one may be among them), HOST:PORT
#   REDIS_HA_FIRST_PRIMARY  the primary when neither the sentinels nor the nodes know one
#   REDIS_HA_MASTER_NAME    default llmesh
#   REDIS_HA_QUORUM         sentinels that must agree the primary is down (default 2 of 3)
#   REDIS_HA_DOWN_AFTER_MS  default 5000; REDIS_HA_FAILOVER_TIMEOUT_MS default 60000
#   REDIS_HA_STATE          optional file recording the primary this sentinel last saw (at
#                           start and on every failover, record-primary.sh), read by node.sh
#   REDIS_HA_RUN_DIR        where sentinel.conf goes (sentinel rewrites it; default /run/sentinel)
#   SENTINEL_PORT           default 26379
#   REDIS_SENTINEL_PASSWORD the sentinels' own password (clients, and sentinel to sentinel)
#   REDIS_PASSWORD_FAILOVER the nodes' "failover" user (deploy/redis/sentinel/ha-users.acl)
set -eu
self=${REDIS_HA_SELF:?set REDIS_HA_SELF to the name of this sentinel}
first=${REDIS_HA_FIRST_PRIMARY:?set REDIS_HA_FIRST_PRIMARY}
name=${REDIS_HA_MASTER_NAME:-llmesh}
sport=${SENTINEL_PORT:-26379}
run=${REDIS_HA_RUN_DIR:-/run/sentinel}
sentinel_password=${REDIS_SENTINEL_PASSWORD:?set REDIS_SENTINEL_PASSWORD}
failover_password=${REDIS_PASSWORD_FAILOVER:?set REDIS_PASSWORD_FAILOVER (deploy/redis/sentinel/ha-users.acl)}
for password in "$sentinel_password" "$failover_password"; do
  case $password in
    *[!A-Za-z0-9._~-]*)
      echo "sentinel.sh: passwords may hold only letters, digits and ._~- (e.g. openssl rand -hex 24)" >&2
      exit 1
      ;;
  esac
done
umask 077

primary=""
primary_port=""
# 1. What the other sentinels monitor now (this one restarted and forgot).
for sentinel in ${REDIS_HA_SENTINELS:-}; do
  [ "${sentinel%:*}" = "$self" ] && continue
  reply=$(REDISCLI_AUTH=$sentinel_password timeout 3 redis-cli --no-auth-warning \
    -h "${sentinel%:*}" -p "${sentinel##*:}" --raw sentinel get-master-addr-by-name "$name" 2>/dev/null) || continue
  port=$(printf '%s\n' "$reply" | sed -n 2p)
  case $port in
    "" | *[!0-9]*) continue ;;
  esac
  primary=$(printf '%s\n' "$reply" | sed -n 1p)
  primary_port=$port
  echo "sentinel.sh: sentinel $sentinel monitors $primary:$primary_port"
  break
done
# 2. Every sentinel restarted: the node that says it is a primary, the one with most replicas.
if [ -z "$primary" ]; then
  best=-1
  for node in ${REDIS_HA_NODES:-}; do
    info=$(REDISCLI_AUTH=$failover_password timeout 3 redis-cli --no-auth-warning --user failover \
      -h "${node%:*}" -p "${node##*:}" info replication 2>/dev/null | tr -d '\r') || continue
    printf '%s\n' "$info" | grep -q '^role:master$' || continue
    replicas=$(printf '%s\n' "$info" | sed -n 's/^connected_slaves://p')
    if [ "${replicas:-0}" -gt "$best" ]; then
      best=${replicas:-0}
      primary=${node%:*}
      primary_port=${node##*:}
    fi
  done
  [ -n "$primary" ] && echo "sentinel.sh: node $primary:$primary_port is a primary with $best replicas"
fi
# 3. Nothing answers (a full restart): the primary recorded before.
if [ -z "$primary" ] && [ -n "${REDIS_HA_STATE:-}" ] && [ -s "$REDIS_HA_STATE" ]; then
  primary=$(sed -n 1p "$REDIS_HA_STATE")
  primary_port=$(sed -n 2p "$REDIS_HA_STATE")
  echo "sentinel.sh: nothing answers: monitoring $primary, the primary last recorded"
fi
# 4. Nothing runs yet: the first primary.
if [ -z "$primary" ]; then
  primary=$first
  primary_port=${REDIS_PORT:-6379}
  echo "sentinel.sh: no primary found: monitoring the first primary $primary"
fi

mkdir -p "$run"
reconfig=""
if [ -n "${REDIS_HA_STATE:-}" ]; then
  printf '%s\n%s\n' "$primary" "$primary_port" >"$REDIS_HA_STATE.tmp" && mv "$REDIS_HA_STATE.tmp" "$REDIS_HA_STATE"
  reconfig="sentinel client-reconfig-script $name $(dirname "$0")/record-primary.sh"
fi
cat >"$run/sentinel.conf" <<CONF
port $sport
dir $run
# Nodes and sentinels are known by name: pod IPs change, the names do not.
sentinel resolve-hostnames yes
sentinel announce-hostnames yes
sentinel announce-ip $self
sentinel announce-port $sport
requirepass $sentinel_password
sentinel sentinel-pass $sentinel_password
sentinel monitor $name $primary $primary_port ${REDIS_HA_QUORUM:-2}
sentinel auth-user $name failover
sentinel auth-pass $name $failover_password
sentinel down-after-milliseconds $name ${REDIS_HA_DOWN_AFTER_MS:-5000}
sentinel failover-timeout $name ${REDIS_HA_FAILOVER_TIMEOUT_MS:-60000}
sentinel parallel-syncs $name 1
$reconfig
CONF
exec redis-server "$run/sentinel.conf" --sentinel "$@"
