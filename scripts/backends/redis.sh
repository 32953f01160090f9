#!/usr/bin/env bash
# Start or stop a throwaway Redis server for tests and local runs.
#
#   scripts/backends/redis.sh install        install redis-server (apt, when root)
#   scripts/backends/redis.sh start DIR      start on a free loopback port; print the URL
#   scripts/backends/redis.sh stop DIR       stop the server started in DIR
#   scripts/backends/redis.sh url DIR        print the URL of the server running in DIR
#
# The server binds 127.0.0.1 only, keeps nothing on disk (no RDB, no AOF) and
# writes redis.pid, redis.log and url into DIR. `start` on a DIR whose server
# is still running prints its URL again. With STALWART_BACKEND_OWNER_PID set, the
# server is stopped by a watcher once that process exits (tests set it to pytest's pid). Exit status 3: redis-server cannot be
# had (not installed and not root).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

ensure_redis() {
  command -v redis-server >/dev/null && return 0
  apt_install redis-server || true
  command -v redis-server >/dev/null ||
    die "redis-server is not installed and cannot be installed here (needs root and apt-get)" 3
}

start() {
  local dir=$1 port attempt
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  if alive "$dir/redis.pid" && [[ -s "$dir/url" ]]; then
    cat "$dir/url"
    return 0
  fi
  ensure_redis
  for attempt in 1 2 3; do
    port=$(free_ports 1)
    cat >"$dir/redis.conf" <<CONF
bind 127.0.0.1
protected-mode yes
port $port
daemonize yes
pidfile $dir/redis.pid
logfile $dir/redis.log
dir $dir
save ""
appendonly no
databases 16
maxmemory-policy noeviction
CONF
    rm -f "$dir/redis.pid"
    redis-server "$dir/redis.conf" >&2 || true
    local i
    for ((i = 0; i < 100; i++)); do
      if port_open 127.0.0.1 "$port" && alive "$dir/redis.pid"; then
        echo "redis://127.0.0.1:$port/0" | tee "$dir/url"
        watch_owner "$(cd "$(dirname "$0")" && pwd)/$(basename "$0")" "$dir"
        return 0
      fi
      sleep 0.05
    done
    log "redis-server did not come up on port $port (attempt $attempt); log tail:"
    tail -n 5 "$dir/redis.log" >&2 || true
    stop_pid "$dir/redis.pid" 2
  done
  die "could not start redis-server"
}

cmd=${1:-}
case "$cmd" in
  install) ensure_redis ;;
  start) [[ $# -eq 2 ]] || die "usage: $0 start DIR" 2; start "$2" ;;
  stop) [[ $# -eq 2 ]] || die "usage: $0 stop DIR" 2; unwatch "$2"; stop_pid "$2/redis.pid" 10; rm -f "$2/url" ;;
  url) [[ $# -eq 2 ]] || die "usage: $0 url DIR" 2; alive "$2/redis.pid" && cat "$2/url" ;;
  *) die "usage: $0 install | start DIR | stop DIR | url DIR" 2 ;;
esac
