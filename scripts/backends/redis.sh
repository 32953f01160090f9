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
# server is stopped by a watcher once that process exits (tests set it to pytest's
# pid). Exit status 3: redis-server cannot be had (not installed and not root).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

ensure_redis() { need_command redis-server redis-server; }

# try_start DIR PORT: one redis-server on PORT, in the foreground of its own session
# (spawn keeps its pid); true once it accepts connections.
try_start() {
  local dir=$1 port=$2
  cat >"$dir/redis.conf" <<CONF
bind 127.0.0.1
protected-mode yes
port $port
daemonize no
logfile $dir/redis.log
dir $dir
save ""
appendonly no
databases 16
maxmemory-policy noeviction
CONF
  spawn "$dir/redis.pid" "$dir/redis.log" redis-server "$dir/redis.conf"
  wait_up redis-server "$dir/redis.pid" "$dir/redis.log" 30 port_open 127.0.0.1 "$port" || return 1
  echo "redis://127.0.0.1:$port/0" | tee "$dir/url"
}

stop_server() { stop_pid "$1/redis.pid" 10; rm -f "$1/url"; }

start() {
  local dir
  dir=$(server_dir "$1")
  if still_running "$dir/redis.pid" "$dir/url"; then
    cat "$dir/url"
    return 0
  fi
  ensure_redis
  start_on_free_ports redis-server 3 1 try_start stop_server "$dir"
}

cmd=${1:-}
case "$cmd" in
  install) ensure_redis ;;
  start) [[ $# -eq 2 ]] || die "usage: $0 start DIR" 2; start "$2" ;;
  stop) [[ $# -eq 2 ]] || die "usage: $0 stop DIR" 2; unwatch "$2"; stop_server "$2" ;;
  url) [[ $# -eq 2 ]] || die "usage: $0 url DIR" 2; alive "$2/redis.pid" && cat "$2/url" ;;
  *) die "usage: $0 install | start DIR | stop DIR | url DIR" 2 ;;
esac
