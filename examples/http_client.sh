#!/usr/bin/env bash
# A client of `marshal-workers serve` in bash, with curl and jq: no Kafka client needed.
#
#   examples/http_client.sh URL OUTPUT [COUNT]
#
# Loops: read up to 10 messages (a long poll of 5 s), handle each (here: append "partition offset value" to
# OUTPUT; a binary value arrives base64-encoded and is decoded first), then ack them in one request. Stops after
# COUNT messages (0 or absent: never), or at SIGTERM / Ctrl-C once the batch in hand is acked.
# A token, if the server needs one, comes from MARSHAL_WORKERS_SERVE_TOKEN.
set -euo pipefail

url=${1:?usage: http_client.sh URL OUTPUT [COUNT]}
output=${2:?usage: http_client.sh URL OUTPUT [COUNT]}
count=${3:-0}
handled=0
stopping=0
trap 'stopping=1' TERM INT

auth=()
if [[ -n "${MARSHAL_WORKERS_SERVE_TOKEN:-}" ]]; then
    auth=(-H "Authorization: Bearer ${MARSHAL_WORKERS_SERVE_TOKEN}")
fi

# post PATH [BODY]: prints the response body, then its HTTP status on a line of its own.
post() {
    curl -sS -X POST "${auth[@]}" -H 'Content-Type: application/json' --data "${2:-}" \
        -w '\n%{http_code}' "$url$1"
}

while (( stopping == 0 )) && (( count == 0 || handled < count )); do
    if ! answer=$(post '/read?timeout=5s&max=10'); then
        sleep 1 # the server is not there (yet): try again
        continue
    fi
    status=${answer##*$'\n'}
    body=${answer%$'\n'*}
    case $status in
        200) ;;
        204) continue ;; # nothing within the timeout
        401) echo "the server wants a token: set MARSHAL_WORKERS_SERVE_TOKEN ($body)" >&2; exit 1 ;;
        *) echo "read: HTTP $status $body" >&2; sleep 1; continue ;;
    esac

    # Handle each message: one line per message, its value decoded.
    while IFS=$'\t' read -r partition offset encoding value; do
        if [[ $encoding == base64 ]]; then
            value=$(printf '%s' "$value" | base64 -d | od -An -tx1 | tr -d ' \n')  # binary: shown as hex
        fi
        printf '%s %s %s\n' "$partition" "$offset" "$value" >> "$output"
        handled=$((handled + 1))
    done < <(jq -r '.messages[] | [.partition, .offset, .encoding, .value] | @tsv' <<< "$body")

    # Ack the batch: the messages are done and never delivered again.
    acks=$(jq -c '[.messages[] | {topic, partition, offset}]' <<< "$body")
    answer=$(post /ack "$acks")
    status=${answer##*$'\n'}
    if [[ $status != 200 ]]; then
        echo "ack: HTTP $status ${answer%$'\n'*}" >&2 # e.g. past the deadline: they come back, to be handled again
    fi
done
