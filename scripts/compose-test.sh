#!/usr/bin/env bash
# make compose-test: build the images and run deploy/docker-compose.yml for real.
#
#  1. a Docker engine: $DOCKER_HOST (or /var/run/docker.sock) when one answers;
#     else one started here with the host's networking untouched (no bridge, no
#     iptables, its own data-root, exec-root, pidfile and socket), stopped at exit;
#  2. a base image: $STALWART_BASE_IMAGE when given, else Debian bookworm from
#     debootstrap (scripts/compose/base-image.sh, cached);
#  3. the four service images (deploy/docker/Dockerfile) and Redis, Ignite and
#     Prometheus from the same base (deploy/docker/backends.Dockerfile);
#  4. the compose file's host-network variant (scripts/compose/hostnet.py): up,
#     every healthcheck healthy, Prometheus scraping every service;
#  5. a job submitted from the CLI container; a trainer and the leader coordinator
#     crashed (kill -9 of their containers' process) while it runs; SUCCEEDED, its
#     weights bitwise equal to a one-process reference run (scripts/compose/drive.py);
#  6. everything torn down (trap): the compose project, its volumes, the engine
#     when started here (checked: no process, mount or host network change left).
#     Images stay: they are the build cache.
#
# The cache lives outside the clone, in $STALWART_CACHE (default
# /var/cache/stalwart): the engine's data-root (images and build layers) and the
# base image's tarball. Measurements go to $STALWART_CACHE/reports/.
# Environment: STALWART_COMPOSE_PORT_BASE (default 27100; ports base..base+220 on
# 127.0.0.1), STALWART_COMPOSE_STEPS (the job's steps, default 100),
# STALWART_COMPOSE_KEEP=1 (leave the stack up for a look; `down` it yourself).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
CACHE=${STALWART_CACHE:-/var/cache/stalwart}
ENGINE=$CACHE/engine
PROJECT=stalwart-compose-test
PORT_BASE=${STALWART_COMPOSE_PORT_BASE:-27100}
WORK=$(mktemp -d /tmp/stalwart-compose.XXXXXX)
STARTED_ENGINE=0
NET_BEFORE=
T0=$SECONDS
export DOCKER_BUILDKIT=0 COMPOSE_DOCKER_CLI_BUILD=0

log() { echo "[compose-test $(date -u +%H:%M:%S)] $*" >&2; }
die() { log "error: $*"; exit 1; }

# ------------------------------------------------------------------ engine
engine_answers() { timeout 20 docker info >/dev/null 2>&1; }

start_engine() {
  if [[ -n ${DOCKER_HOST:-} ]] && engine_answers; then
    log "using the engine at $DOCKER_HOST"; return 0
  fi
  if [[ -z ${DOCKER_HOST:-} && -S /var/run/docker.sock ]] && engine_answers; then
    log "using the engine at /var/run/docker.sock"; return 0
  fi
  export DOCKER_HOST=unix://$ENGINE/docker.sock
  if engine_answers; then  # started earlier (by hand, or a run that was killed): not ours to stop
    log "using the engine already running at $DOCKER_HOST"; return 0
  fi
  command -v dockerd >/dev/null || apt-get install -y -qq docker.io >&2
  mkdir -p "$ENGINE"
  log "starting dockerd (data-root $ENGINE/data, no bridge, no iptables)"
  dockerd --iptables=false --ip-forward=false --ip-masq=false --bridge=none \
    --data-root "$ENGINE/data" --exec-root "$ENGINE/exec" \
    --pidfile "$ENGINE/dockerd.pid" -H "unix://$ENGINE/docker.sock" \
    >"$ENGINE/dockerd.log" 2>&1 </dev/null &
  STARTED_ENGINE=1
  local deadline=$((SECONDS + 120))
  until engine_answers; do
    ((SECONDS < deadline)) || { tail -20 "$ENGINE/dockerd.log" >&2; die "dockerd did not answer"; }
    sleep 1
  done
}

engine_pids() {  # containerd and the shims of the engine started here, found by its folder
  local p
  for p in /proc/[0-9]*; do
    [[ $(cat "$p/comm" 2>/dev/null) == containerd* ]] || continue
    tr '\0' ' ' <"$p/cmdline" 2>/dev/null | grep -qF -- "$ENGINE/" && echo "${p#/proc/}"
  done
  return 0
}

stop_pids() {  # PID...: TERM, up to 60 s for all to exit, then KILL
  (($#)) || return 0
  kill "$@" 2>/dev/null || true
  local pid alive
  for _ in $(seq 60); do
    alive=0
    for pid in "$@"; do if kill -0 "$pid" 2>/dev/null; then alive=1; fi; done
    ((alive)) || return 0
    sleep 1
  done
  kill -9 "$@" 2>/dev/null || true
}

stop_engine() {
  [[ $STARTED_ENGINE == 1 ]] || return 0
  local pid
  pid=$(cat "$ENGINE/dockerd.pid" 2>/dev/null || true)
  log "stopping dockerd ${pid:-?}, then its containerd and shims"
  if [[ -n $pid ]]; then stop_pids "$pid"; fi
  # shellcheck disable=SC2046
  stop_pids $(engine_pids)
  # Nothing of the engine stays mounted (overlay layers, the exec-root's netns).
  grep -o " $ENGINE/[^ ]*" /proc/mounts | sort -r | while read -r m; do umount -l "$m" || true; done
  local procs mounts
  procs=$(engine_pids | tr '\n' ' ')
  mounts=$(grep -c " $ENGINE/" /proc/mounts || true)
  if [[ -n $procs || $mounts != 0 ]]; then
    log "error: the engine left processes [$procs] and $mounts mounts"
    return 1
  fi
}

# --------------------------------------------------------- host networking
# What an engine could change in the host's network: its links (docker0, br-*),
# iptables chains or rules naming DOCKER, IP forwarding. Read before the engine
# starts and after it stops; a difference fails the run. (Other links are not
# compared: other work on the machine may make its own.)
host_net() {
  ip -o link show | awk -F': ' '{print $2}' | grep -E '^(docker[0-9]|br-[0-9a-f]{12})' || true
  iptables-save 2>/dev/null | grep -i docker || true
  echo "ip_forward=$(cat /proc/sys/net/ipv4/ip_forward)"
}

# ------------------------------------------------------------------ images
build() {  # TAG TARGET DOCKERFILE CONTEXT: one image, timed into the report
  local tag=$1 target=$2 file=$3 context=$4 t0
  t0=$(date +%s)
  log "building $tag (target $target)"
  nice -n 10 docker build --network host --force-rm -q -f "$file" --target "$target" -t "$tag" \
    --build-arg BASE_IMAGE="$BASE" \
    --build-arg PIP_INDEX_URL="${PIP_INDEX_URL:-https://pypi.org/simple}" \
    --build-arg PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
    ${TORCH_INDEX_URL:+--build-arg TORCH_INDEX_URL="$TORCH_INDEX_URL"} \
    "$context" >"$WORK/build-$target.log" 2>&1 || {
      tail -40 "$WORK/build-$target.log" >&2; die "docker build $tag failed"; }
  echo "$tag $(($(date +%s) - t0))" >>"$WORK/build-seconds.txt"
}

build_images() {
  BASE=${STALWART_BASE_IMAGE:-stalwart/base:bookworm}
  if [[ -z ${STALWART_BASE_IMAGE:-} ]]; then
    STALWART_CACHE=$CACHE nice -n 10 scripts/compose/base-image.sh import "$BASE"
  fi
  # `wheel` is no image anyone runs: tagged so that the prune below keeps its layers
  # (grpcio-tools) as cache.
  for target in wheel coordinator paramserver health trainer; do
    build "stalwart/$target:dev" "$target" deploy/docker/Dockerfile .
  done
  # The backends' context: the Ignite launcher (Maven) and the script that runs it.
  bash scripts/backends/ignite.sh build
  local ctx=$WORK/backends
  mkdir -p "$ctx/scripts" "$ctx/deploy/ignite"
  cp -r scripts/backends "$ctx/scripts/"
  cp -r deploy/ignite/target "$ctx/deploy/ignite/"
  for target in redis ignite prometheus; do
    build "stalwart/$target:dev" "$target" deploy/docker/backends.Dockerfile "$ctx"
  done
  # The images these builds untagged (layers of an older pyproject.toml or Dockerfile):
  # removed, so the cache keeps one generation (~7 GB) instead of growing by one per change.
  log "$(docker image prune -f 2>&1 | tail -1)"
}

# ----------------------------------------------------------------- compose
compose() { docker-compose -p "$PROJECT" -f "$WORK/hostnet/docker-compose.yml" "$@"; }

remove_leftovers() {  # the project's containers and volumes that `down` left behind
  local ids
  ids=$(docker ps -aq --filter "label=com.docker.compose.project=$PROJECT" 2>/dev/null || true)
  # shellcheck disable=SC2086
  if [[ -n $ids ]]; then docker rm -fv $ids >/dev/null 2>&1 || true; fi
  ids=$(docker volume ls -q --filter "label=com.docker.compose.project=$PROJECT" 2>/dev/null || true)
  # shellcheck disable=SC2086
  if [[ -n $ids ]]; then docker volume rm -f $ids >/dev/null 2>&1 || true; fi
}

teardown() {
  local rc=$?
  trap - EXIT INT TERM
  if [[ -f $WORK/hostnet/docker-compose.yml ]]; then
    if [[ ${STALWART_COMPOSE_KEEP:-} == 1 ]]; then
      log "left up: docker-compose -p $PROJECT -f $WORK/hostnet/docker-compose.yml down -v"
      exit "$rc"
    fi
    if [[ $rc -ne 0 ]]; then
      compose ps >&2 || true
      compose logs --no-color --tail=30 >"$WORK/compose-logs.txt" 2>&1 || true
      tail -150 "$WORK/compose-logs.txt" >&2 || true
    fi
    log "compose down"
    timeout 300 docker-compose -p "$PROJECT" -f "$WORK/hostnet/docker-compose.yml" \
      --profile tools down -v --remove-orphans -t 10 >/dev/null 2>&1 || true
  fi
  if engine_answers; then remove_leftovers; fi
  stop_engine || rc=1
  if [[ -n $NET_BEFORE && $(host_net) != "$NET_BEFORE" ]]; then
    log "error: the host's networking changed: before [$NET_BEFORE] after [$(host_net)]"
    rc=1
  fi
  rm -rf "$WORK"
  if [[ $rc -eq 0 ]]; then log "passed in $((SECONDS - T0)) s"; else log "failed after $((SECONDS - T0)) s"; fi
  exit "$rc"
}

ensure_compose() {
  command -v docker-compose >/dev/null || apt-get install -y -qq docker-compose >&2
  docker-compose version --short >&2
}

ports_free() {
  local port
  for port in $(python3 -c "import json,sys; print(' '.join(str(p) for s in json.load(open(sys.argv[1])).values() for p in s.values()))" "$WORK/hostnet/ports.json"); do
    ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null || die "127.0.0.1:$port is taken; set STALWART_COMPOSE_PORT_BASE"
  done
}

main() {
  trap teardown EXIT INT TERM
  mkdir -p "$CACHE/reports"
  exec 9>"$CACHE/compose-test.lock"
  flock -w 3600 9 || die "another compose-test holds $CACHE/compose-test.lock"
  ensure_compose
  NET_BEFORE=$(host_net)
  start_engine
  local t0=$SECONDS
  build_images
  log "images built in $((SECONDS - t0)) s"
  .venv/bin/python scripts/compose/hostnet.py "$WORK/hostnet" --port-base "$PORT_BASE"
  ports_free
  .venv/bin/python scripts/compose/drive.py --work "$WORK" --project "$PROJECT" \
    --steps "${STALWART_COMPOSE_STEPS:-100}" --report "$CACHE/reports/compose-test.json"
  docker images --format '{{.Repository}}:{{.Tag}} {{.Size}}' 'stalwart/*' | sort >&2
  cp "$WORK/build-seconds.txt" "$CACHE/reports/build-seconds.txt"
}

main "$@"
