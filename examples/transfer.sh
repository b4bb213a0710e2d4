#!/usr/bin/env bash
# Transfers between two accounts, locking both: eight transfers at once, half naming the
# accounts one way and half the other, as two services written by different teams would.
# A lock library that takes the names in the caller's order deadlocks here; redlockd orders
# them itself and takes both or neither. Each account keeps the highest fencing token that
# wrote it and refuses a lower one, and the balances must still add up at the end.
#
#   examples/transfer.sh [LOG_FILE]
#
# Each transfer, in a real deployment:
#   redlockd lock --wait 30s acct:alice acct:bob -- ./transfer.sh alice bob 10
#
# REDLOCKD_SERVER says where redlockd is (default http://127.0.0.1:8080); REDLOCKD the
# binary (default: redlockd on the PATH).
set -euo pipefail
redlockd=${REDLOCKD:-redlockd}
log=${1:-$(mktemp)}
bank=$(mktemp -d)
trap 'rm -rf "$bank"' EXIT
for account in alice bob; do
  echo 100 >"$bank/$account"
  echo 0 >"$bank/$account.token"
done
: >"$log"

# Move $3 from account $1 to account $2, fenced by the lease's token on both accounts.
transfer='
  t=$REDLOCKD_FENCING_TOKEN
  for account in "$1" "$2"; do
    if [ "$t" -le "$(cat "$4/$account.token")" ]; then
      echo "transfer $0: token $t refused by $account" >>"$5"
      exit 1
    fi
  done
  from=$(cat "$4/$1"); to=$(cat "$4/$2")
  sleep 0.05
  echo $((from - $3)) >"$4/$1"; echo $((to + $3)) >"$4/$2"
  echo "$t" >"$4/$1.token"; echo "$t" >"$4/$2.token"
  echo "transfer $0 moved $3 from $1 to $2 (token $t)" >>"$5"
'
pids=()
for i in 1 2 3 4 5 6 7 8; do
  if [ $((i % 2)) -eq 0 ]; then
    names=(acct:alice acct:bob) from=alice to=bob
  else
    names=(acct:bob acct:alice) from=bob to=alice
  fi
  "$redlockd" lock --ttl 10s --wait 30s "${names[@]}" -- \
    sh -c "$transfer" "$i" "$from" "$to" "$i" "$bank" "$log" &
  pids+=("$!")
done
# Every transfer must have run: a lock that could not be taken is said, not skipped.
failed=0
for i in "${!pids[@]}"; do
  if ! wait "${pids[$i]}"; then
    echo "transfer $((i + 1)): redlockd lock failed" >&2
    failed=1
  fi
done
echo "balances: alice $(cat "$bank/alice"), bob $(cat "$bank/bob")" >>"$log"
cat "$log"
exit "$failed"
