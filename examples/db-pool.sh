#!/usr/bin/env bash
# A connection pool of 3 shared by a fleet: eight workers want a database connection at
# once, and at most three hold one at a time. Each worker takes one of 3 permits of the
# semaphore `db-pool` (waiting for one to be freed), uses the connection of its slot, and
# stamps its writes with the permit's fencing token: the "database" keeps the highest token
# it has seen per connection and refuses a lower one, so a worker that lost its permit
# (paused past its validity) can do no harm.
#
#   examples/db-pool.sh [LOG_FILE]
#
# Each worker's own line, in a real deployment:
#   redlockd lock --limit 3 --wait 1m db-pool -- ./use-connection.sh   # slot in $REDLOCKD_SLOT
#
# REDLOCKD_SERVER says where redlockd is (default http://127.0.0.1:8080); REDLOCKD the
# binary (default: redlockd on the PATH).
set -euo pipefail
redlockd=${REDLOCKD:-redlockd}
log=${1:-$(mktemp)}
db=$(mktemp -d)
trap 'rm -rf "$db"' EXIT
: >"$log"

# What each worker runs under its permit: connection $REDLOCKD_SLOT, fenced by the token.
use_connection='
  conn="$1/conn-$REDLOCKD_SLOT"
  # Taking the connection: mkdir fails if another worker holds it now.
  mkdir "$conn.busy" || { echo "worker $0: connection $REDLOCKD_SLOT was in use" >>"$2"; exit 1; }
  seen=$(cat "$conn" 2>/dev/null || echo 0)
  if [ "$REDLOCKD_FENCING_TOKEN" -le "$seen" ]; then
    echo "worker $0: token $REDLOCKD_FENCING_TOKEN refused by connection $REDLOCKD_SLOT" >>"$2"
  else
    echo "$REDLOCKD_FENCING_TOKEN" >"$conn"
    echo "worker $0 used connection $REDLOCKD_SLOT (token $REDLOCKD_FENCING_TOKEN), $(ls -d "$1"/*.busy | wc -l) in use" >>"$2"
  fi
  sleep 0.2
  rmdir "$conn.busy"
'
for worker in 1 2 3 4 5 6 7 8; do
  "$redlockd" lock --limit 3 --ttl 10s --wait 30s db-pool -- \
    sh -c "$use_connection" "$worker" "$db" "$log" &
done
wait
echo "$(grep -c ' used connection ' "$log") of 8 workers used a connection:"
cat "$log"
