#!/usr/bin/env bash
# A private Docker engine for the tests. It never touches the host's network setup (no bridge, no
# iptables/NAT, no IP forwarding: containers can only use network_mode "none" or "host") and shares
# nothing with a system dockerd: own socket, data root, exec root, pidfile, config file and
# containerd namespaces.
#
# Usage: scripts/dockerd.sh start    starts it (idempotent) and prints DOCKER_HOST=unix:///...
#        scripts/dockerd.sh stop     stops it (and the containerd it started) and waits
#        scripts/dockerd.sh status   prints DOCKER_HOST=... when it answers, else fails
# Needs root and the docker.io package (dockerd, containerd, runc, docker-init).
set -euo pipefail

NAME=hermes-foundry-docker
DATA_ROOT=${HERMES_DOCKERD_DATA_ROOT:-/var/lib/$NAME}
RUN_DIR=${HERMES_DOCKERD_RUN_DIR:-/run/$NAME}
SOCKET=${HERMES_DOCKERD_SOCKET:-/run/$NAME.sock}
START_WAIT_S=${HERMES_DOCKERD_WAIT_S:-60}
STOP_WAIT_S=30
EXEC_ROOT=$RUN_DIR/exec
PIDFILE=$RUN_DIR/dockerd.pid
LOG=$RUN_DIR/dockerd.log
DRIVER_FILE=$DATA_ROOT/.hermes-storage-driver  # the driver that worked last time: its images live there
HOST=unix://$SOCKET
export PATH=$PATH:/usr/local/sbin:/usr/sbin:/sbin  # dockerd, runc, docker-init

log() { echo "dockerd.sh: $*" >&2; }
die() { log "error: $*"; exit 1; }

answers() { docker -H "$HOST" info >/dev/null 2>&1; }
# Zombies count as dead: a killed daemon whose parent never reaps it must not block a restart.
pid_alive() {
  [ -n "${1:-}" ] && kill -0 "$1" 2>/dev/null && ! grep -qs '^State:[[:space:]]*Z' "/proc/$1/status"
}
dockerd_pid() { cat "$PIDFILE" 2>/dev/null || true; }
containerd_pid() { cat "$EXEC_ROOT/containerd/containerd.pid" 2>/dev/null || true; }

# SIGTERM, then SIGKILL after $2 seconds; returns once the process is gone.
stop_pid() {
  local pid=$1 waited=0
  pid_alive "$pid" || return 0
  kill -TERM "$pid" 2>/dev/null || true
  while pid_alive "$pid"; do
    if [ "$waited" -ge "$(($2 * 10))" ]; then
      log "pid $pid ignored SIGTERM for $2s; killing it"
      kill -KILL "$pid" 2>/dev/null || true
    fi
    sleep 0.1; waited=$((waited + 1))
  done
}

# Starts dockerd with the given storage driver; 0 once it answers, 1 if it died or never answered.
try_start() {
  local driver=$1 pid waited=0
  log "starting dockerd (storage driver $driver, log $LOG)"
  echo "=== $(date -u +%FT%TZ) start, storage driver $driver" >>"$LOG"
  setsid dockerd \
    --host "$HOST" --data-root "$DATA_ROOT" --exec-root "$EXEC_ROOT" --pidfile "$PIDFILE" \
    --config-file "$RUN_DIR/daemon.json" --storage-driver "$driver" \
    --bridge=none --iptables=false --ip6tables=false --ip-forward=false --ip-masq=false \
    --userland-proxy=false \
    --containerd-namespace "$NAME" --containerd-plugins-namespace "$NAME-plugins" \
    </dev/null >>"$LOG" 2>&1 &
  pid=$!
  while ! answers; do
    if ! pid_alive "$pid"; then
      log "dockerd exited during start-up with storage driver $driver; its log ends with:"
      tail -n 15 "$LOG" >&2
      return 1
    fi
    if [ "$waited" -ge "$((START_WAIT_S * 2))" ]; then
      log "dockerd did not answer within ${START_WAIT_S}s; its log ends with:"
      tail -n 30 "$LOG" >&2
      stop_pid "$pid" "$STOP_WAIT_S"
      return 1
    fi
    sleep 0.5; waited=$((waited + 1))
  done
  echo "$driver" >"$DRIVER_FILE"
}

start() {
  [ "$(id -u)" = 0 ] || die "needs root"
  command -v dockerd >/dev/null || die "dockerd not found (apt-get install docker.io)"
  command -v docker >/dev/null || die "docker CLI not found (apt-get install docker.io)"
  if pid_alive "$(dockerd_pid)" && answers; then
    log "already running (pid $(dockerd_pid))"
    echo "DOCKER_HOST=$HOST"
    return 0
  fi
  stop  # a dead or unresponsive leftover (e.g. after a crash) must not hold the pidfile or socket
  mkdir -p "$DATA_ROOT" "$RUN_DIR"
  echo '{}' >"$RUN_DIR/daemon.json"  # so an /etc/docker/daemon.json of a system engine can't interfere
  # overlay2 is fast; vfs (full copies) works on any filesystem, e.g. where overlay mounts are refused.
  local drivers=${HERMES_DOCKERD_STORAGE_DRIVER:-$(cat "$DRIVER_FILE" 2>/dev/null || true) overlay2 vfs}
  local driver
  for driver in $drivers; do
    if try_start "$driver"; then
      log "dockerd answers on $HOST (pid $(dockerd_pid), storage driver $(docker -H "$HOST" info --format '{{.Driver}}'))"
      echo "DOCKER_HOST=$HOST"
      return 0
    fi
  done
  die "could not start dockerd with any of the storage drivers: $drivers (log: $LOG)"
}

stop() {
  local pid containerd shims
  pid=$(dockerd_pid)
  containerd=$(containerd_pid)  # read first: dockerd removes the file on a clean exit
  if pid_alive "$pid"; then
    log "stopping dockerd (pid $pid)"
    stop_pid "$pid" "$STOP_WAIT_S"
  fi
  # Only what this engine started: its containerd, and shims of containers that outlived a killed dockerd.
  stop_pid "$containerd" 10
  shims=$(pgrep -f -- "containerd-shim.* -address $EXEC_ROOT/" || true)
  for pid in $shims; do stop_pid "$pid" 5; done
  rm -f "$PIDFILE" "$SOCKET"
}

status() {
  if pid_alive "$(dockerd_pid)" && answers; then
    echo "DOCKER_HOST=$HOST"
  else
    log "not running"
    return 1
  fi
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) status ;;
  *) die "usage: $0 start|stop|status" ;;
esac
