#!/usr/bin/env bash
# Generate and compile the Java client (target/, gitignored) from protos/.
#
# protoc and protoc-gen-grpc-java are the pinned executables from Maven Central
# (grpcio-tools' protoc, which the Go and TypeScript clients use, has no Java
# generator); protoc is the release grpcio-tools ships (35.1 = protobuf-java
# 4.35.1, the runtime in pom.xml), and the well-known types come from
# grpcio-tools' copy. Maven resolves the libraries and prints their classpath;
# javac compiles. Run: java -cp "$(cat target/classpath)" dev.stalwart.client.Smoke
set -euo pipefail

GRPC_JAVA_VERSION=${GRPC_JAVA_VERSION:-1.85.0}
PROTOC_VERSION=${PROTOC_VERSION:-4.35.1}

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
python=${PYTHON:-$root/.venv/bin/python}
mvn=(mvn -q -B -Dstyle.color=never -f "$here/pom.xml" -Dgrpc.version="$GRPC_JAVA_VERSION" -Dprotobuf.version="$PROTOC_VERSION")

case "$(uname -m)" in
  x86_64) arch=x86_64 ;;
  aarch64) arch=aarch_64 ;;
  *) echo "build.sh: no protoc-gen-grpc-java for $(uname -m)" >&2; exit 2 ;;
esac
fetch() {  # fetch GROUP:ARTIFACT:VERSION's linux executable into target/bin once; print its path
  local exe="$here/target/bin/$2-$3-linux-$arch.exe"
  if [ ! -x "$exe" ]; then
    "${mvn[@]}" dependency:copy -Dartifact="$1:$2:$3:exe:linux-$arch" \
      -DoutputDirectory="$here/target/bin" >&2
    chmod +x "$exe"
  fi
  echo "$exe"
}
protoc=$(fetch com.google.protobuf protoc "$PROTOC_VERSION")
plugin=$(fetch io.grpc protoc-gen-grpc-java "$GRPC_JAVA_VERSION")
wkt=$("$python" -c 'import grpc_tools, os; print(os.path.join(os.path.dirname(grpc_tools.__file__), "_proto"))')

rm -rf "$here/target/gen" "$here/target/classes"
mkdir -p "$here/target/gen" "$here/target/classes"
(cd "$root" && "$protoc" -Iprotos -I"$wkt" \
  --plugin=protoc-gen-grpc-java="$plugin" \
  --java_out="$here/target/gen" \
  --grpc-java_out=@generated=omit:"$here/target/gen" \
  protos/stalwart/v1/*.proto)

"${mvn[@]}" dependency:build-classpath -Dmdep.outputFile="$here/target/libraries"
find "$here/target/gen" "$here/src/main/java" -name '*.java' > "$here/target/sources"
javac --release 17 -nowarn -d "$here/target/classes" \
  -cp "$(cat "$here/target/libraries")" @"$here/target/sources"
echo "$here/target/classes:$(cat "$here/target/libraries")" > "$here/target/classpath"
echo "built: $(find "$here/target/classes" -name '*.class' | wc -l) classes"
