#!/usr/bin/env bash
# Start or stop a throwaway Kubernetes API server (etcd + kube-apiserver, no kubelet).
#
#   scripts/backends/k8s.sh install      install etcd (apt, when root); check openssl and kubectl
#   scripts/backends/k8s.sh start DIR    start both on free loopback ports; print the kubeconfig
#   scripts/backends/k8s.sh stop DIR     stop what `start` started in DIR
#   scripts/backends/k8s.sh kubeconfig DIR   print the kubeconfig path while it runs
#
# kube-apiserver comes from scripts/k8s/build-apiserver's cache (`make k8s-apiserver`
# builds it; `start` never builds, a cold build takes long), or from $STALWART_KUBE_APISERVER.
# etcd is Debian's etcd-server (installed when root). DIR receives a throwaway CA, the
# serving and admin certificates, the service-account key pair (all openssl), the
# admin kubeconfig, logs and pid files. Nothing listens beyond 127.0.0.1; etcd speaks
# plain HTTP on loopback only. Objects are stored and validated; no pod ever runs.
# With STALWART_BACKEND_OWNER_PID set, both are stopped once that process exits.
# Exit status 3: kube-apiserver, etcd or openssl cannot be had.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

apiserver_binary() {
  if [[ -n ${STALWART_KUBE_APISERVER:-} ]]; then
    [[ -x $STALWART_KUBE_APISERVER ]] || die "STALWART_KUBE_APISERVER=$STALWART_KUBE_APISERVER is not executable" 3
    echo "$STALWART_KUBE_APISERVER"
    return
  fi
  "$HERE/../k8s/build-apiserver" --cached ||
    die "kube-apiserver is not built yet: run make k8s-apiserver (a cold build takes 20+ minutes)" 3
}

ensure_tools() {
  command -v openssl >/dev/null || die "openssl is not installed" 3
  command -v kubectl >/dev/null || die "kubectl is not installed" 3
  command -v etcd >/dev/null || apt_install etcd-server || true
  command -v etcd >/dev/null ||
    die "etcd is not installed and cannot be installed here (needs root and apt-get: etcd-server)" 3
}

# pki DIR: a CA, a serving certificate for 127.0.0.1, an admin client certificate in
# system:masters, and the key pair that signs service-account tokens.
pki() {
  local d=$1/pki
  mkdir -p "$d"
  openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=stalwart-test-ca" \
    -keyout "$d/ca.key" -out "$d/ca.crt" 2>/dev/null
  cert "$d" apiserver "/CN=kube-apiserver" "subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes.default.svc"
  cert "$d" admin "/O=system:masters/CN=stalwart-test-admin" ""
  openssl genrsa -out "$d/sa.key" 2048 2>/dev/null
  openssl rsa -in "$d/sa.key" -pubout -out "$d/sa.pub" 2>/dev/null
}

cert() {  # cert DIR NAME SUBJECT EXTENSION
  local d=$1 name=$2 subject=$3 ext=$4
  openssl req -newkey rsa:2048 -nodes -subj "$subject" \
    -keyout "$d/$name.key" -out "$d/$name.csr" 2>/dev/null
  if [[ -n $ext ]]; then
    openssl x509 -req -in "$d/$name.csr" -CA "$d/ca.crt" -CAkey "$d/ca.key" -CAcreateserial \
      -days 2 -out "$d/$name.crt" -extfile <(echo "$ext") 2>/dev/null
  else
    openssl x509 -req -in "$d/$name.csr" -CA "$d/ca.crt" -CAkey "$d/ca.key" -CAcreateserial \
      -days 2 -out "$d/$name.crt" 2>/dev/null
  fi
}

# spawn PIDFILE LOG CMD...: run CMD in its own session, detached, recording its pid.
spawn() {
  local pidfile=$1 logfile=$2
  shift 2
  setsid "$@" </dev/null >>"$logfile" 2>&1 &
  echo $! >"$pidfile"
}

start_etcd() {
  local dir=$1 client=$2 peer=$3
  rm -rf "$dir/etcd-data"
  spawn "$dir/etcd.pid" "$dir/etcd.log" etcd --name stalwart-test \
    --data-dir "$dir/etcd-data" \
    --listen-client-urls "http://127.0.0.1:$client" --advertise-client-urls "http://127.0.0.1:$client" \
    --listen-peer-urls "http://127.0.0.1:$peer" --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
    --initial-cluster "stalwart-test=http://127.0.0.1:$peer" --listen-metrics-urls "" \
    --log-outputs stderr
  local i
  for ((i = 0; i < 600; i++)); do
    port_open 127.0.0.1 "$client" && return 0
    alive "$dir/etcd.pid" || break
    sleep 0.1
  done
  log "etcd did not come up on port $client; log tail:"
  tail -n 5 "$dir/etcd.log" >&2 || true
  return 1
}

start_apiserver() {
  local dir=$1 bin=$2 etcd_port=$3 port=$4 p=$1/pki
  spawn "$dir/apiserver.pid" "$dir/apiserver.log" "$bin" \
    --etcd-servers "http://127.0.0.1:$etcd_port" \
    --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$port" \
    --tls-cert-file "$p/apiserver.crt" --tls-private-key-file "$p/apiserver.key" \
    --client-ca-file "$p/ca.crt" \
    --service-account-issuer https://kubernetes.default.svc \
    --service-account-key-file "$p/sa.pub" --service-account-signing-key-file "$p/sa.key" \
    --authorization-mode RBAC --anonymous-auth=false \
    --endpoint-reconciler-type none --service-cluster-ip-range 10.96.0.0/16 \
    --cert-dir "$dir/apiserver-certs" --profiling=false
  # Ready = /readyz answers ok to the admin (RBAC bootstrap and every post-start hook done).
  local i
  for ((i = 0; i < 1800; i++)); do
    if KUBECONFIG=$dir/kubeconfig kubectl get --raw /readyz --request-timeout 5s 2>/dev/null | grep -qx ok; then
      return 0
    fi
    alive "$dir/apiserver.pid" || break
    sleep 0.2
  done
  log "kube-apiserver did not become ready on port $port; log tail:"
  tail -n 5 "$dir/apiserver.log" >&2 || true
  return 1
}

write_kubeconfig() {
  local dir=$1 port=$2 p=$1/pki
  local k=(kubectl --kubeconfig "$dir/kubeconfig" config)
  rm -f "$dir/kubeconfig"
  "${k[@]}" set-cluster stalwart-test --server "https://127.0.0.1:$port" \
    --certificate-authority "$p/ca.crt" --embed-certs >/dev/null
  "${k[@]}" set-credentials admin --client-certificate "$p/admin.crt" \
    --client-key "$p/admin.key" --embed-certs >/dev/null
  "${k[@]}" set-context stalwart-test --cluster stalwart-test --user admin >/dev/null
  "${k[@]}" use-context stalwart-test >/dev/null
}

start() {
  local dir=$1 bin attempt
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  if alive "$dir/apiserver.pid" && [[ -s "$dir/kubeconfig" ]]; then
    echo "$dir/kubeconfig"
    return 0
  fi
  ensure_tools
  bin=$(apiserver_binary)
  [[ -s "$dir/pki/sa.key" ]] || pki "$dir"
  for attempt in 1 2; do
    local ports
    mapfile -t ports < <(free_ports 3)
    write_kubeconfig "$dir" "${ports[2]}"
    if start_etcd "$dir" "${ports[0]}" "${ports[1]}" &&
       start_apiserver "$dir" "$bin" "${ports[0]}" "${ports[2]}"; then
      echo "$dir/kubeconfig"
      watch_owner "$HERE/$(basename "$0")" "$dir"
      return 0
    fi
    log "attempt $attempt failed; retrying on fresh ports"
    stop_all "$dir"
  done
  die "could not start etcd and kube-apiserver (logs in $dir)"
}

stop_all() {
  stop_pid "$1/apiserver.pid" 15
  stop_pid "$1/etcd.pid" 10
  rm -rf "$1/etcd-data"
}

cmd=${1:-}
case "$cmd" in
  install) ensure_tools ;;
  start) [[ $# -eq 2 ]] || die "usage: $0 start DIR" 2; start "$2" ;;
  stop) [[ $# -eq 2 ]] || die "usage: $0 stop DIR" 2; unwatch "$2"; stop_all "$2" ;;
  kubeconfig) [[ $# -eq 2 ]] || die "usage: $0 kubeconfig DIR" 2; alive "$2/apiserver.pid" && echo "$2/kubeconfig" ;;
  *) die "usage: $0 install | start DIR | stop DIR | kubeconfig DIR" 2 ;;
esac
