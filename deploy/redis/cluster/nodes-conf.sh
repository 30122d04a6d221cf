#!/bin/sh
# Runs before a Redis Cluster node starts (the init container of components/redis-cluster, and
# tests/integration/deploy/test_redis_cluster_reform.py): rewrites the address of every node in
# its nodes.conf to the one that node's announced hostname resolves to now.
#
# Why: the cluster bus connects to the IP addresses stored in nodes.conf. After a full restart
# every pod has a new IP, so no node can reach any other, and the cluster never re-forms (Redis
# updates a peer's address only when that peer reaches it first). Each node announces a stable
# hostname (cluster-announce-hostname, stored in nodes.conf since Redis 7), so the current
# addresses can be looked up before the server starts.
#
#   sh nodes-conf.sh NODES_CONF [MY_IP]
#
# A node whose name does not resolve within REDIS_CLUSTER_RESOLVE_TIMEOUT seconds (default 60)
# keeps its stored address (it is rewritten on its own start, and gossip tells the others once
# it reaches one of them). No nodes.conf yet (a new node): nothing to do.
set -eu
if [ $# -lt 1 ] || [ $# -gt 2 ]; then
  echo "usage: nodes-conf.sh NODES_CONF [MY_IP]" >&2
  exit 2
fi
conf=$1
my_ip=${2:-}
if [ ! -s "$conf" ]; then
  echo "nodes-conf.sh: no $conf yet (a new node): nothing to rewrite"
  exit 0
fi
deadline=$(($(date +%s) + ${REDIS_CLUSTER_RESOLVE_TIMEOUT:-60}))

resolve() {
  # The first IPv4 or IPv6 address of $1 (getent: glibc and Alpine's musl-utils).
  getent hosts "$1" | awk '{ print $1; exit }'
}

tmp="$conf.rewrite"
: >"$tmp"
while IFS= read -r line || [ -n "$line" ]; do
  # <id> <ip>:<port>@<cport>[,<hostname>[,aux...]] <flags> ...; the last line is "vars ...".
  set -f
  # shellcheck disable=SC2086
  set -- $line
  set +f
  if [ $# -lt 3 ] || [ "$1" = vars ]; then
    printf '%s\n' "$line" >>"$tmp"
    continue
  fi
  id=$1
  address=$2
  endpoint=${address%%,*}
  case $address in
    *,*) names=${address#*,} ;;
    *) names="" ;;
  esac
  hostname=${names%%,*}
  old_ip=${endpoint%:*}
  ports=${endpoint##*:}
  new_ip=""
  case ",$3," in
    *,myself,*) new_ip=$my_ip ;;
  esac
  if [ -z "$new_ip" ] && [ -n "$hostname" ]; then
    until new_ip=$(resolve "$hostname") && [ -n "$new_ip" ]; do
      if [ "$(date +%s)" -ge "$deadline" ]; then
        echo "nodes-conf.sh: $hostname does not resolve: keeping $old_ip" >&2
        new_ip=$old_ip
        break
      fi
      sleep 1
    done
  fi
  if [ -z "$new_ip" ] || [ "$new_ip" = "$old_ip" ]; then
    printf '%s\n' "$line" >>"$tmp"
    continue
  fi
  new_endpoint="$new_ip:$ports"
  echo "nodes-conf.sh: ${hostname:-myself} $old_ip -> $new_ip"
  shift 2
  if [ -n "$names" ]; then
    printf '%s %s,%s %s\n' "$id" "$new_endpoint" "$names" "$*" >>"$tmp"
  else
    printf '%s %s %s\n' "$id" "$new_endpoint" "$*" >>"$tmp"
  fi
done <"$conf"
mv "$tmp" "$conf"
