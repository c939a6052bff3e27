#!/bin/bash
# Reference solution: create app.log as told, write count_errors.sh, run it.
cat > app.log <<'LOG'
2024-05-01T09:00:01 INFO [api] server started
2024-05-01T09:00:05 ERROR [db] connection refused
2024-05-01T09:01:10 WARN [cache] slow response
2024-05-01T09:02:00 ERROR [api] timeout talking to db
2024-05-01T09:02:30 ERROR [db] connection refused
2024-05-01T09:03:00 INFO [worker] job 17 done
2024-05-01T09:03:45 ERROR [auth] token expired
2024-05-01T09:04:00 ERROR [db] deadlock detected
2024-05-01T09:05:12 WARN [db] retrying
2024-05-01T09:06:00 ERROR [api] timeout talking to db
2024-05-01T09:07:30 INFO [api] request served
2024-05-01T09:08:00 ERROR [cache] eviction failed
LOG
cat > count_errors.sh <<'SCRIPT'
#!/bin/bash
# Prints "COMPONENT COUNT" for each component with ERROR lines in the log $1, most errors first.
awk '$2 == "ERROR" { name = $3; gsub(/^\[|\]$/, "", name); count[name]++ }
     END { for (name in count) print name, count[name] }' "$1" | LC_ALL=C sort -k2,2nr -k1,1
SCRIPT
chmod +x count_errors.sh
./count_errors.sh app.log > error_counts.txt
