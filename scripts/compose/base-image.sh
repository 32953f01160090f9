#!/usr/bin/env bash
# The base image every Stalwart image is built on when no registry can be reached:
# Debian bookworm (minbase) made by debootstrap from the mirror apt already uses,
# with python3, python3-venv, python3-pip and the CA certificates this machine
# trusts (so pip and apt inside builds pass an inspecting proxy).
#
#   scripts/compose/base-image.sh rootfs           make the tarball (cached)
#   scripts/compose/base-image.sh import NAME      docker import it as NAME (if missing)
#
# The tarball is cached in $STALWART_CACHE/base (default /var/cache/stalwart/base):
# debootstrap takes minutes and its result only changes with the mirror.
set -euo pipefail
CACHE=${STALWART_CACHE:-/var/cache/stalwart}
TARBALL=$CACHE/base/bookworm-minbase.tar
PACKAGES=python3,python3-venv,python3-pip,ca-certificates

log() { echo "base-image: $*" >&2; }

mirror() {  # the Debian mirror of the host's apt sources (deb822 or one-line form)
  local uri
  uri=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
  [[ -n $uri ]] || uri=$(awk '$1 == "deb" && $3 == "bookworm" {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
  echo "${uri:-http://deb.debian.org/debian}"
}

rootfs() {
  [[ -s $TARBALL ]] && { log "cached: $TARBALL"; return 0; }
  command -v debootstrap >/dev/null || apt-get install -y -qq debootstrap >&2
  local work
  work=$(mktemp -d "$CACHE/base/rootfs.XXXXXX")
  trap 'rm -rf "$work"' RETURN
  log "debootstrap bookworm into $work (minutes)"
  debootstrap --variant=minbase --include="$PACKAGES" bookworm "$work/root" "$(mirror)" >&2
  # Extra CAs of this machine (e.g. a proxy's): trusted inside every build.
  if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
    cp /usr/local/share/ca-certificates/*.crt "$work/root/usr/local/share/ca-certificates/"
    chroot "$work/root" update-ca-certificates >&2
  fi
  chroot "$work/root" apt-get clean
  rm -rf "$work/root/var/lib/apt/lists/"* "$work/root/var/cache/apt/"*.bin
  tar -C "$work/root" -cf "$TARBALL.part" .
  mv "$TARBALL.part" "$TARBALL"
  log "wrote $TARBALL ($(du -h "$TARBALL" | cut -f1))"
}

import() {
  local name=$1
  if docker image inspect "$name" >/dev/null 2>&1; then return 0; fi
  rootfs
  log "docker import $TARBALL as $name"
  docker import "$TARBALL" "$name" >/dev/null
}

mkdir -p "$CACHE/base"
case ${1:-} in
  rootfs) rootfs ;;
  import) [[ $# -eq 2 ]] || { echo "usage: $0 import NAME" >&2; exit 2; }; import "$2" ;;
  *) echo "usage: $0 rootfs | import NAME" >&2; exit 2 ;;
esac
