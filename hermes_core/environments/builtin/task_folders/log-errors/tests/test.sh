#!/bin/bash
# Reward 1 when error_counts.txt is right and count_errors.sh is right on unseen logs too, else 0.
echo 0 > "$REWARD_FILE"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

if [ ! -f error_counts.txt ]; then echo "FAIL: no error_counts.txt in $PWD"; exit 0; fi
if [ ! -x count_errors.sh ]; then echo "FAIL: count_errors.sh is missing or not executable"; exit 0; fi

failed=0
same() {  # same LABEL ACTUAL EXPECTED_FILE
    if [ "$2" = "$(cat "$3")" ]; then
        echo "ok: $1"
    else
        echo "FAIL: $1:"; printf '%s\n' "$2" | head -n 20
        failed=1
    fi
}

same "error_counts.txt" "$(tr -d '\r' < error_counts.txt)" "$TESTS_DIR/expected_app.txt"
cp "$TESTS_DIR/hidden.log" "$work/other.log"
same "another log" "$(timeout 10 ./count_errors.sh "$work/other.log" 2>&1)" "$TESTS_DIR/expected_hidden.txt"
grep -v ERROR "$TESTS_DIR/hidden.log" > "$work/quiet.log"
: > "$work/nothing"
same "a log without errors" "$(timeout 10 ./count_errors.sh "$work/quiet.log" 2>&1)" "$work/nothing"

if [ "$failed" = 0 ]; then echo 1 > "$REWARD_FILE"; fi
