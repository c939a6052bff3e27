#!/bin/bash
# Reward 1 when ./sum.sh gives the right total for every case below, else 0.
echo 0 > "$REWARD_FILE"
work=$(mktemp -d "/tmp/sum cases.XXXXXX")  # a space in every input's path
trap 'rm -rf "$work"' EXIT

if [ ! -f sum.sh ]; then echo "FAIL: no sum.sh in $PWD"; exit 0; fi
if [ ! -x sum.sh ]; then echo "FAIL: sum.sh is not executable"; exit 0; fi

printf '1\n2\n3\n' > "$work/simple.txt"
printf '10\n\n  \n\t\n-4\n 5 \n' > "$work/blank lines.txt"
printf '7\n8' > "$work/no final newline.txt"
: > "$work/empty.txt"
printf -- '-5\n-10\n' > "$work/negative only.txt"
seq 1 1000 > "$work/large.txt"

failed=0
check() {  # check FILE_NAME EXPECTED_OUTPUT
    local got
    got=$(timeout 10 ./sum.sh "$work/$1" 2>&1)
    if [ "$got" = "$2" ]; then
        echo "ok: $1"
    else
        echo "FAIL: $1: expected '$2', got '$got'"
        failed=1
    fi
}

check "simple.txt" "Total: 6"
check "blank lines.txt" "Total: 11"
check "no final newline.txt" "Total: 15"
check "empty.txt" "Total: 0"
check "negative only.txt" "Total: -15"
check "large.txt" "Total: 500500"

if [ "$failed" = 0 ]; then echo 1 > "$REWARD_FILE"; fi
