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
  need_command openssl
  need_command kubectl
  need_command etcd etcd-server
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

start_etcd() {
  local dir=$1 client=$2 peer=$3
  rm -rf "$dir/etcd-data"
  spawn "$dir/etcd.pid" "$dir/etcd.log" etcd --name stalwart-test \
    --data-dir "$dir/etcd-data" \
    --listen-client-urls "http://127.0.0.1:$client" --advertise-client-urls "http://127.0.0.1:$client" \
    --listen-peer-urls "http://127.0.0.1:$peer" --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
    --initial-cluster "stalwart-test=http://127.0.0.1:$peer" --listen-metrics-urls "" \
    --log-outputs stderr
  wait_up etcd "$dir/etcd.pid" "$dir/etcd.log" 60 port_open 127.0.0.1 "$client"
}

# ready KUBECONFIG: /readyz answers ok to the admin (RBAC bootstrap and every
# post-start hook done).
ready() { KUBECONFIG=$1 kubectl get --raw /readyz --request-timeout 5s 2>/dev/null | grep -qx ok; }

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
  wait_up kube-apiserver "$dir/apiserver.pid" "$dir/apiserver.log" 360 ready "$dir/kubeconfig"
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

# try_start DIR ETCD_CLIENT_PORT ETCD_PEER_PORT APISERVER_PORT: etcd, then the API
# server on it; prints the kubeconfig once both are ready.
try_start() {
  local dir=$1
  write_kubeconfig "$dir" "$4" &&
    start_etcd "$dir" "$2" "$3" &&
    start_apiserver "$dir" "$APISERVER" "$2" "$4" &&
    echo "$dir/kubeconfig"
}

start() {
  local dir
  dir=$(server_dir "$1")
  if still_running "$dir/apiserver.pid" "$dir/kubeconfig"; then
    echo "$dir/kubeconfig"
    return 0
  fi
  ensure_tools
  APISERVER=$(apiserver_binary)
  [[ -s "$dir/pki/sa.key" ]] || pki "$dir"
  start_on_free_ports "etcd and kube-apiserver" 2 3 try_start stop_all "$dir"
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
