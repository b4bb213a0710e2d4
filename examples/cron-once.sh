#!/usr/bin/env bash
# A nightly job on a fleet: eight instances fire at about the same time (their clocks and
# schedulers a little apart), exactly one runs the job. `--hold-at-least` keeps the lock for
# the whole tick even though the job takes a moment, so that an instance whose cron fires
# late still finds it held; `--held-exit-code 0` makes "another instance has it" a success
# for cron.
#
#   examples/cron-once.sh [LOG_FILE]
#
# In a real crontab, each instance has just the one line:
#   0 3 * * * redlockd lock --hold-at-least 10m --held-exit-code 0 nightly-report -- /opt/report/send.sh
#
# REDLOCKD_SERVER says where redlockd is (default http://127.0.0.1:8080); REDLOCKD the
# binary (default: redlockd on the PATH).
set -euo pipefail
redlockd=${REDLOCKD:-redlockd}
log=${1:-$(mktemp)}
: >"$log"
for instance in 1 2 3 4 5 6 7 8; do
  (
    sleep "0.$((RANDOM % 5))"
    "$redlockd" lock --ttl 10s --hold-at-least 5s --held-exit-code 0 nightly-report -- \
      sh -c 'echo "instance $0 sent the report (fencing token $REDLOCKD_FENCING_TOKEN)" >>"$1"; sleep 0.2' \
      "$instance" "$log"
  ) &
done
wait
echo "$(wc -l <"$log") of 8 instances ran the job:"
cat "$log"
