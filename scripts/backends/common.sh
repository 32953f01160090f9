# Shared helpers for scripts/backends/*.sh (sourced, not run).
# Messages go to stderr; stdout carries only what callers parse (a URL).

log() { echo "[$(basename "$0")] $*" >&2; }
# die MESSAGE [STATUS]: one "error: MESSAGE" line on stderr, then exit STATUS (default 1).
die() { log "error: $1"; exit "${2:-1}"; }

# The running script's absolute path, for the owner watcher that runs its "stop".
SCRIPT_PATH=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")

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

# need_command CMD [PKG...]: succeed when CMD is on PATH, installing PKG... with apt
# first when root; otherwise exit 3 (the backend cannot be had here) saying why.
need_command() {
  local cmd=$1
  shift
  command -v "$cmd" >/dev/null && return 0
  (($# == 0)) || apt_install "$@" || true
  command -v "$cmd" >/dev/null && return 0
  (($# == 0)) && die "$cmd is not installed" 3
  die "$cmd is not installed and cannot be installed here (needs root and apt-get: $*)" 3
}

# server_dir DIR: create DIR and print its absolute path (pid files outlive a cd).
server_dir() { mkdir -p "$1" && (cd "$1" && pwd); }

# still_running PIDFILE FILE: true when what an earlier `start` left in DIR still
# runs and FILE (what that start printed) is there, so `start` can print it again.
still_running() { alive "$1" && [[ -s $2 ]]; }

# spawn PIDFILE LOG CMD...: run CMD detached in its own session (a Ctrl-C in the
# caller's terminal does not reach it), output appended to LOG, its pid in PIDFILE.
spawn() {
  local pidfile=$1 logfile=$2
  shift 2
  setsid "$@" </dev/null >>"$logfile" 2>&1 &
  echo $! >"$pidfile"
}

# wait_up NAME PIDFILE LOG TIMEOUT_S CHECK...: poll CHECK until it succeeds; false
# (with LOG's tail on stderr) once the process of PIDFILE has exited or TIMEOUT_S passed.
# A CHECK that passes only counts while that process still runs (a port taken by
# another process between the pick and the bind does not look like this server).
wait_up() {
  local name=$1 pidfile=$2 logfile=$3 deadline=$((SECONDS + $4))
  shift 4
  while ((SECONDS < deadline)); do
    alive "$pidfile" || break
    "$@" && return 0
    sleep 0.2
  done
  log "$name did not come up; log tail:"
  tail -n 5 "$logfile" >&2 || true
  return 1
}

# start_on_free_ports NAME TRIES NPORTS TRY STOP DIR: run "TRY DIR PORT..." with NPORTS
# fresh free ports, up to TRIES times (another process can take a port between the
# pick and the bind); TRY prints what `start` prints. After a failed try "STOP DIR"
# clears what it left. On success the owner watcher is set up; else exit 1.
start_on_free_ports() {
  local name=$1 tries=$2 nports=$3 try=$4 stop=$5 dir=$6 attempt
  local -a ports
  for ((attempt = 1; attempt <= tries; attempt++)); do
    mapfile -t ports < <(free_ports "$nports")
    if "$try" "$dir" "${ports[@]}"; then
      watch_owner "$SCRIPT_PATH" "$dir"
      return 0
    fi
    log "$name did not start (attempt $attempt of $tries)"
    "$stop" "$dir"
  done
  die "could not start $name (logs in $dir)"
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
