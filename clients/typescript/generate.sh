#!/usr/bin/env bash
# Generate the TypeScript client (src/gen/, gitignored) from protos/ with ts-proto.
#
# The compiler is the protoc grpcio-tools ships (python -m grpc_tools.protoc, from
# the project venv), as for the Python and Go code; the plugin is the pinned
# ts-proto from node_modules (npm ci). google/rpc/status.proto and
# error_details.proto come from googleapis-common-protos in the same venv, so
# the client decodes the google.rpc.Status in grpc-status-details-bin with
# generated types instead of hand-written ones.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
python=${PYTHON:-$root/.venv/bin/python}
plugin="$here/node_modules/.bin/protoc-gen-ts_proto"
test -x "$plugin" || { echo "generate.sh: run npm ci in $here first" >&2; exit 1; }
# The folder holding google/rpc/*.proto inside the installed googleapis-common-protos.
googleapis=$("$python" -c 'import google.rpc, os; print(os.path.dirname(os.path.dirname(google.rpc.__path__[0])))')

rm -rf "$here/src/gen"
mkdir -p "$here/src/gen"
cd "$root"
"$python" -m grpc_tools.protoc -Iprotos -I"$googleapis" \
  --plugin=protoc-gen-ts_proto="$plugin" \
  --ts_proto_out="$here/src/gen" \
  --ts_proto_opt=outputServices=grpc-js,env=node,esModuleInterop=true,forceLong=number \
  protos/stalwart/v1/*.proto google/rpc/status.proto google/rpc/error_details.proto
echo "generated: $(cd "$here/src/gen" && find . -name '*.ts' | sort | tr '\n' ' ')"
