#!/bin/sh
# Sentinel's client-reconfig-script (sentinel.sh sets it when REDIS_HA_STATE is set): on every
# change of primary, records the new one in $REDIS_HA_STATE (on the pod's volume), where
# node.sh and sentinel.sh look when no sentinel answers (a full restart after a failover).
#   record-primary.sh MASTER-NAME ROLE STATE FROM-IP FROM-PORT TO-IP TO-PORT
set -eu
[ $# -eq 7 ] || exit 0
printf '%s\n%s\n' "$6" "$7" >"$REDIS_HA_STATE.tmp"
mv "$REDIS_HA_STATE.tmp" "$REDIS_HA_STATE"
