#!/usr/bin/env bash
# A primary and its standby: each instance campaigns for the `primary` election with its
# address as the value; the elected one serves, the other stands by and takes over the
# moment the primary's connection closes (or at the TTL, if its host vanishes). Clients
# learn where the primary is from the observe stream, without polling.
#
#   examples/standby.sh ADDRESS        one instance (run two: 10.0.0.1:5432, 10.0.0.2:5432)
#   examples/standby.sh --follow       print each change of primary, as a client would
#
# REDLOCKD_SERVER says where redlockd is (default http://127.0.0.1:8080).
set -euo pipefail
here=$(dirname "$0")
. "$here/lib/campaign.sh"

if [ "${1:-}" = --follow ]; then
  curl -sN "$server/elections/primary/observe" | while read -r line; do
    case $line in
      "event: "*) event=${line#event: } ;;
      "data: "*) echo "$event ${line#data: }" ;;
    esac
  done
  exit 0
fi

address=$1
campaign primary "$address" 3000
echo "$address: serving as primary (term $term)"
while still_leading; do
  sleep 0.1
done
echo "$address: no longer primary; stopping" >&2
exit 1
