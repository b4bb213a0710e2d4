#!/usr/bin/env bash
# One worker of a fleet that processes an ordered queue: the elected leader processes the
# items in order, the others stand by; when the leader dies, the next is elected at once
# and carries on after the last item done. Each item done is stamped with the leader's
# term, and the "resource" (the done file) refuses a term lower than the last it saw:
# fencing, so that a deposed leader that has not noticed yet cannot write.
#
#   examples/queue-worker.sh NAME QUEUE_FILE DONE_FILE
#
# Start three (each with `setsid` or in its own terminal), kill the leader's process group,
# and watch another carry on. REDLOCKD_SERVER says where redlockd is (default
# http://127.0.0.1:8080); ITEM_SECONDS how long an item takes (default 0.05).
set -euo pipefail
here=$(dirname "$0")
. "$here/lib/campaign.sh"
me=$1 queue=$2 done=$3
touch "$done"

campaign queue-worker "$me" 2000
while still_leading; do
  next=$(($(wc -l <"$done") + 1))
  item=$(sed -n "${next}p" "$queue")
  if [ -z "$item" ]; then
    echo "$me: queue done"
    exit 0
  fi
  last_term=$(tail -n 1 "$done" | awk '{print $3}')
  if [ -n "$last_term" ] && [ "$last_term" -gt "$term" ]; then
    echo "$me: deposed (term $term < $last_term); stopping" >&2
    exit 1
  fi
  echo "$item $me $term" >>"$done"
  sleep "${ITEM_SECONDS:-0.05}"
done
echo "$me: leadership ended; stopping" >&2
exit 1
