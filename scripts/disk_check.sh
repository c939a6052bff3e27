#!/usr/bin/env bash
# Fails, saying where and how much, when a folder's filesystem has less free space than the test
# suite needs. Without it a full disk shows up mid-suite as "No space left on device" in whichever
# fixtures come next (a CI run once ended with 15 failures and 26 errors that way).
#
# Usage: scripts/disk_check.sh FOLDER...   (HERMES_TEST_DISK_GB: the space needed, default below)
set -euo pipefail
need_gb=${HERMES_TEST_DISK_GB:-5}
[[ $need_gb =~ ^[0-9]+$ ]] || { echo "disk_check: HERMES_TEST_DISK_GB must be a whole number of GB, not '$need_gb'" >&2; exit 2; }
status=0
for folder in "$@"; do
  [ -d "$folder" ] || continue
  free_mb=$(df -Pm "$folder" | awk 'NR == 2 {print $4}')
  if [ "$free_mb" -lt $((need_gb * 1024)) ]; then
    echo "disk_check: only $((free_mb / 1024)).$((free_mb % 1024 * 10 / 1024)) GB free for $folder;" \
         "the test suite needs about $need_gb GB there (HERMES_TEST_DISK_GB sets it)." >&2
    echo "disk_check: what takes the space: du -xsh $folder/* | sort -h" >&2
    status=1
  fi
done
exit "$status"
