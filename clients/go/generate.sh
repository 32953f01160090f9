#!/usr/bin/env bash
# Generate the Go client (stalwartv1/*.pb.go, gitignored) from protos/.
#
# protoc itself is the one grpcio-tools ships (python -m grpc_tools.protoc, from
# the project venv), so the Python and Go code come from the same compiler and
# the same .proto files. The two Go plugins are pinned and installed from the
# Go module proxy into $(go env GOPATH)/bin.
set -euo pipefail

PROTOC_GEN_GO_VERSION=${PROTOC_GEN_GO_VERSION:-v1.36.12}
PROTOC_GEN_GO_GRPC_VERSION=${PROTOC_GEN_GO_GRPC_VERSION:-v1.6.0}
MODULE=github.com/stalwart-ml/stalwart/clients/go

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
python=${PYTHON:-$root/.venv/bin/python}
gobin=$(go env GOPATH)/bin

# `go install` of a cached version is a no-op, so running it every time keeps
# the plugins at the pinned versions without a version check of our own.
go install "google.golang.org/protobuf/cmd/protoc-gen-go@${PROTOC_GEN_GO_VERSION}"
go install "google.golang.org/grpc/cmd/protoc-gen-go-grpc@${PROTOC_GEN_GO_GRPC_VERSION}"

rm -f "$here"/stalwartv1/*.pb.go
cd "$root"
"$python" -m grpc_tools.protoc -Iprotos \
  --plugin=protoc-gen-go="$gobin/protoc-gen-go" \
  --plugin=protoc-gen-go-grpc="$gobin/protoc-gen-go-grpc" \
  --go_out="$here" --go_opt=module="$MODULE" \
  --go-grpc_out="$here" --go-grpc_opt=module="$MODULE" \
  protos/stalwart/v1/*.proto
echo "generated: $(cd "$here" && ls stalwartv1/*.pb.go | tr '\n' ' ')"
