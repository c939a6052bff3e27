#!/usr/bin/env bash
# Test images for the sandbox backends, built from the Debian package mirror only (never a
# container registry):
#   (a) a minimal Debian bookworm root filesystem with python3 (the local backend's image root and
#       the source of the docker image), cached between runs under /var/cache/hermes-foundry;
#   (b) the docker image hermes-test/bookworm:latest imported from it, when a Docker engine answers
#       (DOCKER_HOST is honoured; see scripts/dockerd.sh).
# Idempotent and crash-safe: the rootfs is built in a temporary folder, renamed into place when
# complete and then marked; concurrent runs (of this script or another debootstrap of the same
# path) are waited for instead of duplicated. Needs root, debootstrap and the mirror.
#
# Usage: scripts/test_images.sh [rootfs|docker|all]   (default: all)
set -euo pipefail

ROOTFS_PARENT=${HERMES_ROOTFS_DIR:-/var/cache/hermes-foundry/rootfs}
SUITE=bookworm
MIRROR=${HERMES_DEBIAN_MIRROR:-http://deb.debian.org/debian}
IMAGE=${HERMES_TEST_IMAGE:-hermes-test/bookworm:latest}
WAIT_S=${HERMES_ROOTFS_WAIT_S:-1800}  # how long to wait for someone else's build of the same rootfs
ROOTFS=$ROOTFS_PARENT/$SUITE
MARKER=$ROOTFS/.hermes-rootfs-complete
what=${1:-all}

log() { echo "test_images: $*" >&2; }
die() { log "error: $*"; exit 1; }

# debootstrap removes <target>/debootstrap only when it finished successfully.
rootfs_valid() {
  [ ! -e "$1/debootstrap" ] && [ -x "$1/bin/sh" ] && [ -x "$1/usr/bin/python3" ] && grep -qs 'VERSION_CODENAME=bookworm' "$1/etc/os-release"
}

# A debootstrap working on our rootfs or next to it (this script's temp dir, someone else's).
foreign_build_running() { pgrep -f "debootstrap.*$ROOTFS_PARENT" >/dev/null; }

# A crashed debootstrap may leave /proc or /sys mounted inside its target: unmount before deleting.
remove_tree() {
  local dir=$1 mnt
  [ -e "$dir" ] || return 0
  for mnt in $(awk -v d="$dir" 'index($2, d) == 1 {print $2}' /proc/mounts | sort -r); do
    umount -l "$mnt" || true
  done
  rm -rf --one-file-system "$dir"
}

build_rootfs() {
  mkdir -p "$ROOTFS_PARENT"
  exec 9>"$ROOTFS_PARENT/.$SUITE.lock"
  flock 9  # one build at a time among runs of this script
  local waited=0
  while [ ! -e "$MARKER" ] && foreign_build_running; do
    [ "$waited" -ge "$WAIT_S" ] && die "another debootstrap into $ROOTFS_PARENT is still running after ${WAIT_S}s"
    [ "$waited" = 0 ] && log "another debootstrap is building under $ROOTFS_PARENT; waiting for it"
    sleep 5; waited=$((waited + 5))
  done
  if [ -e "$MARKER" ]; then
    log "rootfs $ROOTFS is complete (cached)"
    return 0
  fi
  if [ -d "$ROOTFS" ]; then
    if rootfs_valid "$ROOTFS"; then  # built by someone else, finished, never marked by us
      log "rootfs $ROOTFS exists and is valid; marking it complete"
      date -u +%FT%TZ >"$MARKER"
      return 0
    fi
    log "removing incomplete rootfs $ROOTFS (no build is running)"
    remove_tree "$ROOTFS"
  fi
  command -v debootstrap >/dev/null || die "debootstrap is not installed (apt-get install debootstrap)"
  local tmp=$ROOTFS_PARENT/.$SUITE.partial
  remove_tree "$tmp"
  log "building $ROOTFS with debootstrap from $MIRROR (a few minutes)"
  local started=$SECONDS
  debootstrap --variant=minbase --include=python3 "$SUITE" "$tmp" "$MIRROR" >"$ROOTFS_PARENT/.$SUITE.log" 2>&1 || {
    tail -n 30 "$ROOTFS_PARENT/.$SUITE.log" >&2
    die "debootstrap failed (log: $ROOTFS_PARENT/.$SUITE.log)"
  }
  rm -rf "$tmp"/var/cache/apt/archives/*.deb "$tmp"/var/lib/apt/lists/*  # not needed at run time
  rootfs_valid "$tmp" || die "debootstrap finished but $tmp lacks bin/sh, usr/bin/python3 or bookworm os-release"
  mv -T "$tmp" "$ROOTFS"
  date -u +%FT%TZ >"$MARKER"
  log "rootfs ready in $((SECONDS - started))s"
}

build_docker_image() {
  command -v docker >/dev/null || { log "no docker CLI; skipping the docker image"; return 0; }
  if ! docker info >/dev/null 2>&1; then
    log "no Docker engine answers (DOCKER_HOST=${DOCKER_HOST:-unset}); skipping the docker image"
    return 0
  fi
  if docker image inspect "$IMAGE" >/dev/null 2>&1; then
    log "docker image $IMAGE is present"
    return 0
  fi
  [ -e "$MARKER" ] || build_rootfs
  log "importing $ROOTFS as $IMAGE"
  # Device nodes, /proc and /sys contents are provided by the engine at run time.
  tar -C "$ROOTFS" --numeric-owner --exclude=./.hermes-rootfs-complete --exclude='./dev/*' \
      --exclude='./proc/*' --exclude='./sys/*' --exclude='./var/cache/apt/archives/*.deb' -c . |
    docker import --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
      --change 'ENV LANG=C.UTF-8' --change 'CMD ["/bin/bash"]' - "$IMAGE" >/dev/null
  log "docker image $IMAGE ready"
}

case "$what" in
  rootfs) build_rootfs ;;
  docker) build_docker_image ;;
  all) build_rootfs; build_docker_image ;;
  *) die "usage: $0 [rootfs|docker|all]" ;;
esac
