#!/usr/bin/env bash
# Readers and a writer on one file: two readers read it together; a writer that comes
# meanwhile waits for them; two readers that come a moment after the writer wait behind it,
# and so read what it wrote. The "file" checks the fencing rule a resource can keep with
# shared holders: a write needs a token above every token it has seen, a read one at least
# the last write's.
#
#   examples/readers-writer.sh [LOG_FILE]
#
# Each process's own line, in a real deployment:
#   redlockd lock --shared --wait 1m report -- ./read-report.sh     # a reader
#   redlockd lock --wait 1m report -- ./write-report.sh             # the writer
#
# REDLOCKD_SERVER says where redlockd is (default http://127.0.0.1:8080); REDLOCKD the
# binary (default: redlockd on the PATH).
set -euo pipefail
redlockd=${REDLOCKD:-redlockd}
log=${1:-$(mktemp)}
file=$(mktemp -d)
trap 'rm -rf "$file"' EXIT
echo 0 >"$file/version"
echo 0 >"$file/last-write"
: >"$file/tokens"
: >"$log"

# A read: the token must be at least the last write's, and no write may be under way.
read_it='
  t=$REDLOCKD_FENCING_TOKEN
  [ -e "$1/writing" ] && echo "$0: read during a write" >>"$2"
  [ "$t" -lt "$(cat "$1/last-write")" ] && echo "$0: token $t refused (below the last write)" >>"$2"
  echo "$t" >>"$1/tokens"
  touch "$1/reading-$0"
  sleep 0.3
  echo "$0 read version $(cat "$1/version")" >>"$2"
  rm "$1/reading-$0"
'
# A write: the token must be above every token seen, and nobody may be reading.
write_it='
  t=$REDLOCKD_FENCING_TOKEN
  mkdir "$1/writing"
  ls "$1"/reading-* >/dev/null 2>&1 && echo "$0: write during a read" >>"$2"
  highest=$(sort -n "$1/tokens" | tail -n 1)
  [ "$t" -le "${highest:-0}" ] && echo "$0: token $t refused (not above every token seen)" >>"$2"
  echo "$t" >>"$1/tokens"
  echo "$t" >"$1/last-write"
  echo $(( $(cat "$1/version") + 1 )) >"$1/version"
  sleep 0.2
  echo "$0 wrote version $(cat "$1/version")" >>"$2"
  rmdir "$1/writing"
'
run() { # who, shared or exclusive, what to run
  local flag=()
  [ "$2" = shared ] && flag=(--shared)
  "$redlockd" lock "${flag[@]}" --ttl 10s --wait 30s report -- sh -c "$3" "$1" "$file" "$log"
}
run reader-1 shared "$read_it" &
run reader-2 shared "$read_it" &
# The writer comes while both read (at most 10 s for them to start).
for _ in $(seq 200); do
  [ -e "$file/reading-reader-1" ] && [ -e "$file/reading-reader-2" ] && break
  sleep 0.05
done
run writer exclusive "$write_it" &
sleep 0.1
run reader-3 shared "$read_it" &
run reader-4 shared "$read_it" &
wait
cat "$log"
