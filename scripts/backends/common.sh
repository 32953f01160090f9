# Shared helpers for scripts/backends/*.sh (sourced, not run).
# Messages go to stderr; stdout carries only what callers parse (a URL).

log() { echo "[$(basename "$0")] $*" >&2; }
die() { log "error: $*"; exit "${2:-1}"; }

# free_ports N: print N distinct free TCP ports on 127.0.0.1, one per line.
# The kernel picks them (bind to port 0); there is a small window before the
# server binds, so starters retry once with fresh ports when a bind fails.
free_ports() {
  python3 - "$1" <<'PY'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    socks.append(s)
print("\n".join(str(s.getsockname()[1]) for s in socks))
for s in socks:
    s.close()
PY
}

# port_open HOST PORT: true when something accepts TCP connections there.
port_open() { (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; }

# alive PIDFILE: true when the pidfile names a running process.
alive() { [[ -s "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

# stop_pid PIDFILE [GRACE_S]: SIGTERM, wait up to GRACE_S, then SIGKILL.
stop_pid() {
  local pidfile=$1 grace=${2:-10} pid i
  [[ -s "$pidfile" ]] || return 0
  pid=$(cat "$pidfile")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < grace * 10; i++)); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
      log "pid $pid ignored SIGTERM for ${grace}s; sending SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
    fi
  fi
  rm -f "$pidfile"
}

# apt_install PKG...: install Debian packages when root; fail otherwise.
apt_install() {
  if [[ $(id -u) -ne 0 ]]; then
    return 1
  fi
  command -v apt-get >/dev/null || return 1
  log "installing $* with apt-get"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2 && apt-get install -y -qq --no-install-recommends "$@" >&2
}

# watch_owner SCRIPT DIR: when $STALWART_BACKEND_OWNER_PID is set, leave behind a
# small watcher that runs "SCRIPT stop DIR" once that process is gone, so servers
# do not outlive a test run that was killed before it could stop them.
watch_owner() {
  local script=$1 dir=$2 owner=${STALWART_BACKEND_OWNER_PID:-}
  [[ $owner =~ ^[0-9]+$ ]] || return 0
  setsid bash -c '
    while kill -0 "$1" 2>/dev/null && [[ -e "$3/.watch" ]]; do sleep 2; done
    [[ -e "$3/.watch" ]] && "$2" stop "$3" >/dev/null 2>&1
    rm -f "$3/.watch"
  ' watcher "$owner" "$script" "$dir" </dev/null >/dev/null 2>&1 &
  echo $! >"$dir/.watch"
}

# unwatch DIR: end the watcher of DIR (a normal stop).
unwatch() {
  local dir=$1
  [[ -s "$dir/.watch" ]] && kill "$(cat "$dir/.watch")" 2>/dev/null
  rm -f "$dir/.watch"
  return 0
}
