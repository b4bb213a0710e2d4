# Sourced by the election examples: campaign for an election over a held stream (curl and
# server-sent events, nothing else), block until elected, then watch for the end of the
# leadership in the background.
#
#   campaign ELECTION VALUE TTL_MS   sets $term (the leader's fencing token) when elected,
#                                    and $lost_flag, a file that becomes non-empty when the
#                                    leadership ends (lost, or the stream closed)
#   still_leading                    true while it has not ended
#
# The stream is this process's connection: if the process dies, the connection closes and
# the next candidate is elected at once. Run the example in a process group of its own
# and stop the group, so that curl goes with it.

server=${REDLOCKD_SERVER:-http://127.0.0.1:8080}
server=${server%%,*}

campaign() {
  local election=$1 value=$2 ttl_ms=$3 line event= stream
  lost_flag=$(mktemp)
  term=
  # Waits are bounded by the server (REDLOCKD_MAX_WAIT_MS, a minute by default): a
  # campaign that is still waiting then ends with `failed` lock_held, and starts again.
  while [ -z "$term" ]; do
    coproc CAMPAIGN {
      exec curl -sN -X POST \
        "$server/elections/$election/hold?value=$value&ttl_ms=$ttl_ms&wait_ms=60000"
    }
    # Leaving ends the campaign (a still-open stream would keep the leadership).
    trap 'kill "${CAMPAIGN_PID:-}" 2>/dev/null || true' EXIT
    # A plain descriptor: bash does not pass a coprocess's own to background jobs.
    exec {stream}<&"${CAMPAIGN[0]}"
    while read -r line <&"$stream"; do
      case $line in
        "event: "*) event=${line#event: } ;;
        "data: "*)
          case $event in
            queued) echo "$value: standing by (${line#data: })" ;;
            elected)
              term=$(sed -E 's/.*"term":([0-9]+).*/\1/' <<<"${line#data: }")
              echo "$value: elected, term $term"
              break ;;
            failed)
              case $line in
                *'"error":"lock_held"'*) break ;;
                *) echo "$value: failed: ${line#data: }" >&2; exit 1 ;;
              esac ;;
            lost) echo "$value: lost: ${line#data: }" >&2; exit 1 ;;
          esac ;;
        "") ;;
        *) echo "$value: $line" >&2; exit 1 ;;
      esac
    done
    if [ -z "$term" ]; then
      exec {stream}<&-
      wait "${CAMPAIGN_PID:-}" 2>/dev/null || true
      sleep 0.1
    fi
  done
  # The rest of the stream: heartbeats, then `lost` or the end.
  {
    while read -r line; do
      case $line in "event: lost") echo lost >"$lost_flag" ;; esac
    done
    echo closed >>"$lost_flag"
  } <&"$stream" &
}

still_leading() {
  [ ! -s "$lost_flag" ]
}
