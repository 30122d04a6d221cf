#!/bin/sh
# Renders a shipped ACL rules file (users.acl, cache-users.acl) into the ACL file Redis loads:
# comments dropped, each enabled user's password appended from $REDIS_PASSWORD_<USER> (user
# name upper-cased, "-" as "_"). Users that are `off` or `nopass` get none. Passwords come from
# a Secret (Kubernetes) or deploy/compose/.env, never from this repository.
#   sh acl.sh RULES OUT && exec redis-server ... --aclfile OUT
set -eu
if [ $# -ne 2 ]; then
  echo "usage: acl.sh RULES OUT" >&2
  exit 2
fi
rules=$1
out=$2
umask 077
tmp="$out.tmp"
: >"$tmp"
while IFS= read -r line || [ -n "$line" ]; do
  case $line in
    "user "*) ;;
    *) continue ;;
  esac
  case " $line " in
    *" off "* | *" nopass "*)
      printf '%s\n' "$line" >>"$tmp"
      continue
      ;;
  esac
  name=$(printf '%s\n' "$line" | cut -d' ' -f2)
  var="REDIS_PASSWORD_$(printf '%s' "$name" | tr 'a-z-' 'A-Z_')"
  password=$(printenv "$var" || true)
  if [ -z "$password" ]; then
    echo "acl.sh: $var is not set: the Redis password of user '$name' (deploy/README.md \"Redis users and passwords\")" >&2
    rm -f "$tmp"
    exit 1
  fi
  # The password goes on the line as ">password": no blanks, at least 16 characters.
  case $password in
    *[!A-Za-z0-9._~-]*)
      echo "acl.sh: $var may hold only letters, digits and ._~- (e.g. openssl rand -hex 24)" >&2
      rm -f "$tmp"
      exit 1
      ;;
  esac
  if [ ${#password} -lt 16 ]; then
    echo "acl.sh: $var is shorter than 16 characters" >&2
    rm -f "$tmp"
    exit 1
  fi
  printf '%s >%s\n' "$line" "$password" >>"$tmp"
done <"$rules"
mv "$tmp" "$out"
