#!/bin/sh
# Starts one data node of the replicated Redis (components/redis-sentinel, and
# deploy/compose/redis-ha.yml): the shared redis.conf plus replication settings, the ACL users
# of users.acl and ha-users.acl, as the primary or as a replica of the primary the sentinels
# report.
#
#   sh node.sh REDIS_CONF [redis-server options...]
#
# Environment:
#   REDIS_HA_SELF           this node's name, as the others reach it (redis-0.redis-headless)
#   REDIS_HA_FIRST_PRIMARY  the node that starts as primary when no sentinel knows one yet
#   REDIS_HA_SENTINELS      the sentinels, HOST:PORT separated by blanks
#   REDIS_HA_MASTER_NAME    the name the sentinels monitor (default llmesh)
#   REDIS_HA_STATE          optional file where this pod's sentinel records the primary it
#                           last saw (record-primary.sh); read when no sentinel answers
#   REDIS_HA_MIN_REPLICAS   min-replicas-to-write (default 1: the primary refuses writes no
#                           replica receives, deploy/redis/RUNBOOK.md)
#   REDIS_HA_ACL_DIR        acl.sh and users.acl (default /etc/redis-acl)
#   REDIS_HA_DIR            this folder: ha-users.acl (default /etc/redis-ha)
#   REDIS_HA_RUN_DIR        where the rendered files go, memory only (default /run/redis)
#   REDIS_PORT              default 6379
#   REDIS_SENTINEL_PASSWORD, REDIS_PASSWORD_<USER> of every user (acl.sh)
set -eu
if [ $# -lt 1 ]; then
  echo "usage: node.sh REDIS_CONF [redis-server options...]" >&2
  exit 2
fi
conf=$1
shift
self=${REDIS_HA_SELF:?set REDIS_HA_SELF to the name of this node}
first=${REDIS_HA_FIRST_PRIMARY:?set REDIS_HA_FIRST_PRIMARY}
name=${REDIS_HA_MASTER_NAME:-llmesh}
port=${REDIS_PORT:-6379}
acl_dir=${REDIS_HA_ACL_DIR:-/etc/redis-acl}
ha_dir=${REDIS_HA_DIR:-/etc/redis-ha}
run=${REDIS_HA_RUN_DIR:-/run/redis}
replica_password=${REDIS_PASSWORD_REPLICA:?set REDIS_PASSWORD_REPLICA (deploy/redis/sentinel/ha-users.acl)}
umask 077

sh "$acl_dir/acl.sh" "$acl_dir/users.acl" "$run/users.acl.part"
sh "$acl_dir/acl.sh" "$ha_dir/ha-users.acl" "$run/ha-users.acl.part"
cat "$run/users.acl.part" "$run/ha-users.acl.part" >"$run/users.acl"
rm -f "$run/users.acl.part" "$run/ha-users.acl.part"

# The primary the sentinels agree on now; none (the first start, or every sentinel down): the
# first primary. A node that restarts after a failover thus comes back as a replica.
primary=""
for sentinel in ${REDIS_HA_SENTINELS:-}; do
  reply=$(REDISCLI_AUTH=${REDIS_SENTINEL_PASSWORD:-} timeout 3 redis-cli --no-auth-warning \
    -h "${sentinel%:*}" -p "${sentinel##*:}" --raw sentinel get-master-addr-by-name "$name" 2>/dev/null) || continue
  host=$(printf '%s\n' "$reply" | sed -n 1p)
  answered_port=$(printf '%s\n' "$reply" | sed -n 2p)
  case $answered_port in
    "" | *[!0-9]*) continue ;;
  esac
  primary=$host
  echo "node.sh: sentinel $sentinel reports the primary $primary"
  break
done
if [ -z "$primary" ] && [ -n "${REDIS_HA_STATE:-}" ] && [ -s "$REDIS_HA_STATE" ]; then
  primary=$(sed -n 1p "$REDIS_HA_STATE")
  echo "node.sh: no sentinel answers: $primary was the primary last recorded"
fi
if [ -z "$primary" ]; then
  primary=$first
  echo "node.sh: no sentinel knows a primary: $first is the first primary"
fi

{
  cat "$conf"
  printf '\n# node.sh\n'
  printf 'port %s\n' "$port"
  printf 'aclfile %s\n' "$run/users.acl"
  # The others (and the sentinels) reach this node by its name, not its pod IP.
  printf 'replica-announce-ip %s\n' "$self"
  printf 'masteruser replica\n'
  printf 'masterauth %s\n' "$replica_password"
  printf 'min-replicas-to-write %s\n' "${REDIS_HA_MIN_REPLICAS:-1}"
  printf 'min-replicas-max-lag 10\n'
  printf 'replica-read-only yes\n'
  if [ "$primary" != "$self" ]; then
    printf 'replicaof %s %s\n' "$primary" "$port"
  fi
} >"$run/redis.conf"
echo "node.sh: starting $self as $([ "$primary" = "$self" ] && echo primary || echo "replica of $primary")"
exec redis-server "$run/redis.conf" "$@"
