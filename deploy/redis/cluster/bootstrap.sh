#!/bin/sh
# Forms the Redis Cluster of components/redis-cluster (the Job redis-cluster-bootstrap, and
# tests/integration/deploy/test_redis_cluster_reform.py). Safe to run at any time:
#   - every node ok and knowing all the others: nothing to do;
#   - nodes that already belong to a cluster (nodes.conf on their volumes) but are not ok yet,
#     e.g. after a full restart: waits for them to re-form (nodes-conf.sh gave each node the
#     current addresses of the others at its start); never creates a cluster over them;
#   - every node empty (the first start): redis-cli --cluster create.
#
#   sh bootstrap.sh HOST:PORT HOST:PORT HOST:PORT ...
#
# REDIS_CLUSTER_REPLICAS (default 1) replicas per primary; REDIS_CLUSTER_BOOTSTRAP_TIMEOUT
# (default 300) seconds for the nodes to answer and the cluster to be ok; REDISCLI_AUTH if the
# nodes require a password. Exit 0 once every node reports cluster_state:ok.
set -eu
if [ $# -lt 3 ]; then
  echo "usage: bootstrap.sh HOST:PORT HOST:PORT HOST:PORT ..." >&2
  exit 2
fi
replicas=${REDIS_CLUSTER_REPLICAS:-1}
deadline=$(($(date +%s) + ${REDIS_CLUSTER_BOOTSTRAP_TIMEOUT:-300}))

cli() {
  target=$1
  shift
  timeout 10 redis-cli -h "${target%:*}" -p "${target##*:}" "$@"
}

# One field of a node's CLUSTER INFO (empty when the node does not answer).
info() {
  cli "$1" cluster info 2>/dev/null | tr -d '\r' | sed -n "s/^$2://p"
}

expired() {
  [ "$(date +%s)" -ge "$deadline" ]
}

formed() {
  for node in "$@"; do
    [ "$(info "$node" cluster_state)" = ok ] || return 1
    known=$(info "$node" cluster_known_nodes)
    [ "${known:-0}" -ge $# ] || return 1
  done
}

for node in "$@"; do
  until [ "$(cli "$node" ping 2>/dev/null | tr -d '\r')" = PONG ]; do
    if expired; then
      echo "bootstrap.sh: $node does not answer" >&2
      exit 1
    fi
    sleep 2
  done
done

if formed "$@"; then
  echo "bootstrap.sh: cluster already formed"
  exit 0
fi

empty=yes
for node in "$@"; do
  if [ "$(info "$node" cluster_known_nodes)" != 1 ] || [ "$(info "$node" cluster_slots_assigned)" != 0 ]; then
    echo "bootstrap.sh: $node already belongs to a cluster"
    empty=no
  fi
done

if [ "$empty" = yes ]; then
  # --cluster create wants IP addresses: each node's own end of a connection to it.
  addresses=""
  for node in "$@"; do
    addresses="$addresses $(cli "$node" client info | tr ' ' '\n' | sed -n 's/^laddr=//p')"
  done
  echo "bootstrap.sh: creating the cluster of$addresses"
  # shellcheck disable=SC2086
  redis-cli --cluster create $addresses --cluster-replicas "$replicas" --cluster-yes
fi

until formed "$@"; do
  if expired; then
    echo "bootstrap.sh: the cluster is not ok; deploy/redis/RUNBOOK.md \"Re-forming the Redis Cluster\"" >&2
    exit 1
  fi
  sleep 2
done
echo "bootstrap.sh: cluster ok"
