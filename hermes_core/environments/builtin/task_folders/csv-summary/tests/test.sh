#!/bin/bash
# Partial credit: a quarter each for the header, the set of regions, the totals and the order.
expected="$TESTS_DIR/expected_summary.csv"
score=0
if [ -f summary.csv ]; then
    actual=$(tr -d '\r' < summary.csv)
    want=$(cat "$expected")
    header() { printf '%s\n' "$1" | head -n 1; }
    rows() { printf '%s\n' "$1" | tail -n +2 | sed '/^$/d'; }
    if [ "$(header "$actual")" = "$(header "$want")" ]; then
        score=$((score + 1)); echo "ok: header"
    else
        echo "FAIL: header is '$(header "$actual")'"
    fi
    if [ "$(rows "$actual" | cut -d, -f1 | LC_ALL=C sort)" = "$(rows "$want" | cut -d, -f1 | LC_ALL=C sort)" ]; then
        score=$((score + 1)); echo "ok: regions"
    else
        echo "FAIL: regions are" $(rows "$actual" | cut -d, -f1)
    fi
    if [ "$(rows "$actual" | LC_ALL=C sort)" = "$(rows "$want" | LC_ALL=C sort)" ]; then
        score=$((score + 1)); echo "ok: totals"
    else
        echo "FAIL: totals differ"
    fi
    if [ "$(rows "$actual")" = "$(rows "$want")" ]; then
        score=$((score + 1)); echo "ok: order"
    else
        echo "FAIL: rows or their order differ"
    fi
else
    echo "FAIL: no summary.csv in $PWD"
fi
awk -v score="$score" 'BEGIN { printf "%.2f\n", score / 4 }' > "$REWARD_FILE"
