#!/usr/bin/env bash
# Build the lab's base images locally from Debian packages (no registry is reachable):
#   debootstrap --variant=minbase <suite>  ->  docker import  ->  Dockerfile adding python3,
#   python3-apt and systemd. Each result is tagged by a content hash of its inputs, so a
#   second run with the same inputs reuses it; `:latest` always points at the current hash.
# Usage: scripts/base-images.sh [suite...]   (default: bookworm, plus trixie if reachable)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
repo=${LAB_IMAGE_REPO:-mm3-lab}
context="$here/images/debian-systemd"   # the Dockerfile and what it copies

declare -A version=([bookworm]=12 [trixie]=13)

suites=("$@")
if [ ${#suites[@]} -eq 0 ]; then
  suites=(bookworm)
  if [ "${LAB_DEBIAN13:-auto}" != no ] \
     && curl -fsS --max-time 10 -o /dev/null "$mirror/dists/trixie/Release"; then
    suites+=(trixie)
  fi
fi

build_suite() {
  local suite=$1 v hash final start rootfs
  v=${version[$suite]:?unknown suite $suite (known: ${!version[*]})}
  hash=$( { cat "$0" "$context"/*; echo "$suite $mirror"; } | sha256sum | cut -c1-12)
  final="$repo/debian$v-systemd"
  start=$(date +%s)
  if docker image inspect "$final:$hash" >/dev/null 2>&1; then
    docker tag "$final:$hash" "$final:latest"
    echo "base-images: $final:$hash cached (content hash of the inputs), tagged latest"
    return
  fi
  rootfs=$(mktemp -d /tmp/rootfs-$suite.XXXXXX)
  trap "rm -rf '$rootfs' '$rootfs.log'" EXIT
  echo "base-images: debootstrap $suite from $mirror (about a minute)"
  debootstrap --variant=minbase "$suite" "$rootfs" "$mirror" >"$rootfs.log" 2>&1 \
    || { tail -20 "$rootfs.log"; echo "base-images: debootstrap $suite failed (log above)" >&2; exit 1; }
  tar -C "$rootfs" -c . | docker import - "$repo/debian$v-rootfs:$hash" >/dev/null
  echo "base-images: building $final:$hash (python3, python3-apt, systemd)"
  docker build -q --build-arg "BASE=$repo/debian$v-rootfs:$hash" \
    --label "org.mm3.content-hash=$hash" -t "$final:$hash" -t "$final:latest" \
    "$context" >/dev/null
  echo "base-images: $final:$hash built in $(( $(date +%s) - start )) s"
}

# One build at a time per machine (make test's lanes may both ask): a second caller waits,
# then finds the images cached.
exec 9>"${TMPDIR:-/tmp}/mm3-base-images.lock"
flock 9
# The suites are independent and mostly wait on the mirror: build them at the same time.
pids=()
for suite in "${suites[@]}"; do
  ( build_suite "$suite" ) &
  pids+=("$!")
done
rc=0
for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
exit $rc
