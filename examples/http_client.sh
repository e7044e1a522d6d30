#!/usr/bin/env bash
# A client of `marshal-workers serve` in bash, with curl and jq: no Kafka client needed.
#
#   examples/http_client.sh URL [OUTPUT [COUNT]]
#
# Loops: read up to $BATCH messages (default 10; a long poll of 5 s), handle each (here: append the line
# "partition offset value" to OUTPUT, or print it when OUTPUT is - or absent), then ack the batch in one request.
# Stops after COUNT messages (0 or absent: never), or at SIGTERM / Ctrl-C once the batch in hand is acked (exit 0).
# A token, if the server wants one, comes from MARSHAL_WORKERS_SERVE_TOKEN; a 401 or another 4xx ends the script
# (exit 1); 5xx answers and an unreachable server are retried after a second.
set -euo pipefail

url=${1:?usage: http_client.sh URL [OUTPUT [COUNT]]}
output=${2:--}
count=${3:-0}
batch=${BATCH:-10}
handled=0
stopping=0
trap 'stopping=1' TERM INT

auth=()
if [[ -n "${MARSHAL_WORKERS_SERVE_TOKEN:-}" ]]; then
    auth=(-H "Authorization: Bearer ${MARSHAL_WORKERS_SERVE_TOKEN}")
fi
if [[ $output == - ]]; then exec 3>&1; else exec 3>>"$output"; fi

# The handler: one message's value arrives decoded on stdin, exact bytes (it may be binary: never put it in a
# shell variable, which cannot hold a NUL byte).
handle() { # PARTITION OFFSET < value
    { printf '%s %s ' "$1" "$2"; cat; printf '\n'; } >&3
}

# post PATH [BODY]: sets status and body (the server's JSON); fails when the server cannot be reached. curl ignores
# SIGINT: Ctrl-C lets the request in flight finish (a long poll within 5 s), so no batch is left half done.
post() {
    local answer
    answer=$(trap '' INT; curl -sS -X POST "${auth[@]}" -H 'Content-Type: application/json' --data "${2:-}" \
        -w '\n%{http_code}' "$url$1") || return
    status=${answer##*$'\n'}
    body=${answer%$'\n'*}
}

# A 4xx is a mistake that trying again will not mend: say what the server said, and stop.
refused() { # WHAT
    echo "$1: HTTP $status $body" >&2
    [[ $status == 401 ]] && echo "(set MARSHAL_WORKERS_SERVE_TOKEN to the server's token)" >&2
    exit 1
}

# Ack IDS (a JSON list of {topic, partition, offset}), retried while the server is unreachable or answers 5xx: an
# ack is idempotent.
ack() { # IDS
    local ids=$1 tries
    for tries in 1 2 3 4 5; do
        if post /ack "$ids"; then
            case $status in
                200) return ;;
                409) # some were no longer pending (deadline passed, lease ended): they come back, to be handled again
                    echo "ack: $(jq -c '.messages | map([.partition, .offset, .state])' <<< "$body") refused" >&2
                    if [[ $(jq -r .error <<< "$body") != not_pending ]]; then return; fi
                    # not_pending acked none of them: ack the others again, without the refused ones.
                    ids=$(jq -c --argjson bad "$body" '[.[] | select([.partition, .offset] as $id |
                        $bad.messages | map([.partition, .offset]) | index([$id]) | not)]' <<< "$ids")
                    if [[ $ids == '[]' ]]; then return; fi
                    continue ;;
                4*) refused ack ;;
            esac
            echo "ack: HTTP $status $body (try $tries)" >&2
        fi
        sleep 1
    done
    echo "ack: giving up: the batch comes back after its deadline, to be handled again" >&2
}

while (( stopping == 0 )) && (( count == 0 || handled < count )); do
    most=$(( count == 0 || count - handled > batch ? batch : count - handled ))
    if ! post "/read?timeout=5s&max=$most"; then
        (( stopping )) || sleep 1 # the server is not there (yet): try again
        continue
    fi
    case $status in
        200) ;;
        204) sleep 0.1; continue ;; # nothing within the timeout (or at once, from a server that is stopping)
        4*) refused read ;;
        *) echo "read: HTTP $status $body" >&2; sleep 1; continue ;;
    esac

    # Handle each message, its value decoded: JSON text as is, binary (encoding base64) through base64 -d.
    while read -r i partition offset encoding; do
        jq -j --argjson i "$i" '.messages[$i].value // empty' <<< "$body" |
            if [[ $encoding == base64 ]]; then base64 -d; else cat; fi | handle "$partition" "$offset"
        handled=$((handled + 1))
    done < <(jq -r '.messages | to_entries[] | "\(.key) \(.value.partition) \(.value.offset) \(.value.encoding)"' \
        <<< "$body")

    # Ack the batch: the messages are done and never delivered again.
    ack "$(jq -c '[.messages[] | {topic, partition, offset}]' <<< "$body")"
done
