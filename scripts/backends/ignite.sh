#!/usr/bin/env bash
# Start or stop throwaway Apache Ignite 2.x server nodes for tests and local runs.
#
#   scripts/backends/ignite.sh install          Java 17 + Maven (apt, when root), then build
#   scripts/backends/ignite.sh build            resolve ignite-core, compile the launcher
#   scripts/backends/ignite.sh start DIR [N]    start N nodes (default 1); print the URL
#   scripts/backends/ignite.sh run DIR C D M    one node in the foreground, client/discovery/
#                                               communication ports C D M (a container's process)
#   scripts/backends/ignite.sh stop DIR         stop every node started in DIR
#   scripts/backends/ignite.sh url DIR          print the URL of the nodes running in DIR
#
# Each node binds 127.0.0.1 only, finds its peers through a static list of
# loopback discovery ports (never multicast), keeps everything in memory and
# serves thin clients on a free port. The URL is ignite://127.0.0.1:P1[,127.0.0.1:P2...].
# Environment: STALWART_IGNITE_HEAP (default 512m), STALWART_IGNITE_REGION_MB
# (off-heap data region, default 1024), STALWART_IGNITE_START_TIMEOUT (s, default 120),
# STALWART_IGNITE_JVM_OPTS (extra JVM flags; default -XX:TieredStopAtLevel=1, which
# starts faster on small machines at no measurable cost to thin-client throughput).
# STALWART_BACKEND_OWNER_PID: stop the nodes once that process exits (tests set it).
# Exit status 3: Java or Maven cannot be had (not installed and not root).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PROJECT=$ROOT/deploy/ignite
JAR=$PROJECT/target/stalwart-ignite-node.jar
LIB=$PROJECT/target/lib
MAIN=dev.stalwart.ignite.StalwartIgniteNode
HEAP=${STALWART_IGNITE_HEAP:-512m}
# 1 GiB of off-heap pages (allocated as used, from 64 MiB): room for `stalwart bench
# ckpt`'s 256 MiB model, its raw copy and the stall checkpoints. The URL printed
# carries a checkpoint budget of 70% of what the chunks can use (one copy per node
# with one node, else two copies over the nodes), so writers refuse a checkpoint
# with STORE_FULL long before the region is full: a full in-memory region halts
# the node (IgniteOutOfMemoryException). See docs/stores.md, "Capacity".
REGION_MB=${STALWART_IGNITE_REGION_MB:-1024}
START_TIMEOUT=${STALWART_IGNITE_START_TIMEOUT:-120}

# Module openings Ignite 2.x needs on Java 17 (the same set its own launcher passes).
JAVA17_OPENS=(
  --add-opens=java.base/jdk.internal.access=ALL-UNNAMED
  --add-opens=java.base/jdk.internal.misc=ALL-UNNAMED
  --add-opens=java.base/sun.nio.ch=ALL-UNNAMED
  --add-opens=java.base/sun.util.calendar=ALL-UNNAMED
  --add-opens=java.management/com.sun.jmx.mbeanserver=ALL-UNNAMED
  --add-opens=jdk.internal.jvmstat/sun.jvmstat.monitor=ALL-UNNAMED
  --add-opens=java.base/sun.reflect.generics.reflectiveObjects=ALL-UNNAMED
  --add-opens=jdk.management/com.sun.management.internal=ALL-UNNAMED
  --add-opens=java.base/java.io=ALL-UNNAMED
  --add-opens=java.base/java.nio=ALL-UNNAMED
  --add-opens=java.base/java.net=ALL-UNNAMED
  --add-opens=java.base/java.util=ALL-UNNAMED
  --add-opens=java.base/java.util.concurrent=ALL-UNNAMED
  --add-opens=java.base/java.util.concurrent.locks=ALL-UNNAMED
  --add-opens=java.base/java.util.concurrent.atomic=ALL-UNNAMED
  --add-opens=java.base/java.lang=ALL-UNNAMED
  --add-opens=java.base/java.lang.invoke=ALL-UNNAMED
  --add-opens=java.base/java.math=ALL-UNNAMED
  --add-opens=java.sql/java.sql=ALL-UNNAMED
  --add-opens=java.base/java.lang.reflect=ALL-UNNAMED
  --add-opens=java.base/java.time=ALL-UNNAMED
  --add-opens=java.base/java.text=ALL-UNNAMED
  --add-opens=java.management/sun.management=ALL-UNNAMED
)

java_major() {
  java -version 2>&1 | awk -F'"' '/version/ {split($2, v, "."); print (v[1] == "1" ? v[2] : v[1]); exit}'
}

ensure_tools() {
  need_command java openjdk-17-jdk-headless maven  # both in one apt run on a bare machine
  need_command javac openjdk-17-jdk-headless
  local major
  major=$(java_major)
  [[ ${major:-0} -ge 11 ]] || die "Ignite 2.x needs Java 11 or newer; found ${major:-none}" 3
}

built() {
  [[ -s $JAR && -s $LIB/ignite-core-2.16.0.jar && $JAR -nt $PROJECT/pom.xml ]] || return 1
  [[ -z $(find "$PROJECT/src" -newer "$JAR" -type f -print -quit) ]]
}

build() {
  built && return 0
  ensure_tools
  need_command mvn maven
  log "building the Ignite launcher (mvn package dependency:copy-dependencies)"
  mvn -q -B -Dstyle.color=never -f "$PROJECT/pom.xml" package dependency:copy-dependencies >&2 ||
    die "maven build of deploy/ignite failed" 3
}

node_command() { # DIR CLIENT_PORT DISCOVERY_PORT COMM_PORT PEERS: the java command line
  local dir=$1
  NODE_CMD=(java -server -Xms64m -Xmx"$HEAP" -XX:+UseSerialGC -XX:+ExitOnOutOfMemoryError
    -Xss1m ${STALWART_IGNITE_JVM_OPTS--XX:TieredStopAtLevel=1}
    "${JAVA17_OPENS[@]}"
    -Djava.net.preferIPv4Stack=true
    -DIGNITE_HOME="$dir" -DIGNITE_QUIET=true -DIGNITE_NO_ASCII=true
    -DIGNITE_UPDATE_NOTIFIER=false -DIGNITE_PERFORMANCE_SUGGESTIONS_DISABLED=true
    -cp "$JAR:$LIB/*" "$MAIN"
    --host 127.0.0.1 --client-port "$2" --discovery-port "$3" --communication-port "$4"
    --peers "$5" --work-dir "$dir/work" --region-mb "$REGION_MB")
}

start_node() { # DIR CLIENT_PORT DISCOVERY_PORT COMM_PORT PEERS
  local dir=$1
  mkdir -p "$dir/work"
  node_command "$@"
  : >"$dir/ignite.log"  # readiness is read from this log: no line of an earlier try
  spawn "$dir/ignite.pid" "$dir/ignite.log" "${NODE_CMD[@]}"
}

# One node in the foreground on fixed ports, its log on stdout: a container's process.
run_node() { # DIR CLIENT_PORT DISCOVERY_PORT COMM_PORT
  mkdir -p "$1/work"
  node_command "$1" "$2" "$3" "$4" "127.0.0.1:$3"
  exec "${NODE_CMD[@]}"
}

# try_start DIR PORT...: one node per three ports (client, discovery, communication),
# each told every discovery port; prints the URL once every node is ready.
try_start() {
  local dir=$1 ports=("${@:2}") nodes=$((($# - 1) / 3)) peers="" url="" i t0 up=0 deadline
  for ((i = 0; i < nodes; i++)); do
    peers+="${peers:+,}127.0.0.1:${ports[3 * i + 1]}"
    url+="${url:+,}127.0.0.1:${ports[3 * i]}"
  done
  t0=$(date +%s.%N)
  for ((i = 0; i < nodes; i++)); do
    start_node "$dir/node$i" "${ports[3 * i]}" "${ports[3 * i + 1]}" "${ports[3 * i + 2]}" "$peers"
  done
  deadline=$((SECONDS + START_TIMEOUT))
  while ((up < nodes && SECONDS < deadline)); do
    up=0
    for ((i = 0; i < nodes; i++)); do
      alive "$dir/node$i/ignite.pid" || break 2
      # Ready = Ignition.start returned (the launcher says so) and the port answers.
      grep -q "stalwart-ignite-node ready" "$dir/node$i/ignite.log" 2>/dev/null &&
        port_open 127.0.0.1 "${ports[3 * i]}" && up=$((up + 1))
    done
    ((up == nodes)) || sleep 0.2
  done
  if ((up < nodes)); then
    log "ignite did not come up; log tail of node0:"
    tail -n 20 "$dir/node0/ignite.log" >&2 || true
    return 1
  fi
  log "$nodes node(s) up in $(python3 -c "print(f'{$(date +%s.%N) - $t0:.1f}')")s"
  local copies=$((nodes < 2 ? 1 : 2))
  echo "ignite://$url?budget_mb=$((REGION_MB * nodes * 7 / (10 * copies)))" | tee "$dir/url"
}

start() {
  local dir nodes=${2:-1}
  [[ $nodes =~ ^[1-9][0-9]*$ ]] || die "node count must be a positive integer" 2
  dir=$(server_dir "$1")
  if still_running "$dir/node0/ignite.pid" "$dir/url"; then
    cat "$dir/url"
    return 0
  fi
  build
  start_on_free_ports Ignite 2 $((3 * nodes)) try_start stop_nodes "$dir"
}

stop_nodes() {
  local pidfile
  for pidfile in "$1"/node*/ignite.pid; do
    [[ -e $pidfile ]] && stop_pid "$pidfile" 20
  done
  rm -f "$1/url"
}

cmd=${1:-}
case "$cmd" in
  install) ensure_tools; build ;;
  build) build ;;
  start) [[ $# -ge 2 && $# -le 3 ]] || die "usage: $0 start DIR [NODES]" 2; start "$2" "${3:-1}" ;;
  run) [[ $# -eq 5 ]] || die "usage: $0 run DIR CLIENT_PORT DISCOVERY_PORT COMM_PORT" 2; run_node "$2" "$3" "$4" "$5" ;;
  stop) [[ $# -eq 2 ]] || die "usage: $0 stop DIR" 2; unwatch "$2"; stop_nodes "$2" ;;
  url) [[ $# -eq 2 ]] || die "usage: $0 url DIR" 2; alive "$2/node0/ignite.pid" && cat "$2/url" ;;
  *) die "usage: $0 install | build | start DIR [NODES] | run DIR PORTS... | stop DIR | url DIR" 2 ;;
esac
