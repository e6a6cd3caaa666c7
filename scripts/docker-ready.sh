#!/usr/bin/env bash
# Make sure a Docker engine answers on this machine, plus debootstrap for the base images.
# Installs Debian's docker.io with apt where we are root and it is missing; otherwise stops
# with the exact command to run. Starts dockerd through systemd, or directly where PID 1 is
# not systemd (CI containers and sandboxes).
set -euo pipefail
log=/var/log/mm3-dockerd.log
# One caller at a time (make test's lanes may both ask; two apt runs would collide).
exec 9>"${TMPDIR:-/tmp}/mm3-docker-ready.lock"
flock 9

need_root() {
  echo "docker-ready: $1 Run as root:  $2" >&2
  exit 1
}

if ! command -v debootstrap >/dev/null 2>&1; then
  [ "$(id -u)" = 0 ] || need_root "debootstrap is missing (it builds the lab's base images)." \
    "apt-get install -y debootstrap"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
fi

if docker info >/dev/null 2>&1; then
  echo "docker-ready: engine $(docker version -f '{{.Server.Version}}') answers"
  exit 0
fi

if ! command -v dockerd >/dev/null 2>&1; then
  [ "$(id -u)" = 0 ] || need_root "the Docker engine is not installed." \
    "apt-get install -y docker.io && systemctl enable --now docker"
  echo "docker-ready: installing Debian's docker.io with apt"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io >/dev/null
fi

if [ "$(ps -p 1 -o comm= 2>/dev/null)" = systemd ]; then
  [ "$(id -u)" = 0 ] || need_root "the Docker engine is not running." "systemctl start docker"
  systemctl start docker
else
  [ "$(id -u)" = 0 ] || need_root "the Docker engine is not running." "dockerd &"
  echo "docker-ready: starting dockerd (no systemd here; log in $log)"
  # 9>&-: the daemon must not inherit (and so hold forever) the lock taken above.
  setsid nohup dockerd >"$log" 2>&1 < /dev/null 9>&- &
fi
for _ in $(seq 1 60); do
  if docker info >/dev/null 2>&1; then
    echo "docker-ready: engine $(docker version -f '{{.Server.Version}}') answers"
    exit 0
  fi
  sleep 1
done
echo "docker-ready: dockerd did not answer within 60 s; last lines of $log:" >&2
tail -20 "$log" >&2 || true
exit 1
