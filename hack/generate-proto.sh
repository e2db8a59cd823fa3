#!/usr/bin/env bash
# Regenerates the gateway's Go code (api/gateway/v1) from gateway.proto and the
# package-runtime service's (api/quixos) from its three .proto files, with
# Debian's protoc (package protobuf-compiler, installed here when missing)
# and protoc-gen-go / protoc-gen-go-grpc at the versions pinned by go.mod's
# `tool` directives (run through `go tool`, never from PATH), so that the
# generated files are the same on every machine.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

if ! command -v protoc >/dev/null 2>&1; then
  echo "generate-proto: protoc is missing; installing Debian's protobuf-compiler" >&2
  if [ "$(id -u)" -ne 0 ]; then
    echo "generate-proto: run as root, or install protobuf-compiler: apt-get install -y protobuf-compiler" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq protobuf-compiler >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq protobuf-compiler >/dev/null; }
fi

# `go tool -n` builds the pinned plugin (once, into the build cache) and
# prints its path.
gen_go=$(go tool -n protoc-gen-go)
gen_grpc=$(go tool -n protoc-gen-go-grpc)

protoc \
  --plugin=protoc-gen-go="$gen_go" --plugin=protoc-gen-go-grpc="$gen_grpc" \
  --proto_path=api/gateway/v1 \
  --go_out=api/gateway/v1 --go_opt=paths=source_relative \
  --go-grpc_out=api/gateway/v1 --go-grpc_opt=paths=source_relative \
  gateway.proto

# The package-runtime service of the Quixos seed (quixos.runtime.PackageRuntime),
# verbatim, and the two files it imports (ours). The seed's files carry no
# go_package option and must stay verbatim, so the Go import paths are given
# here with M mappings.
quixos=api/quixos
maps=(
  "camino/api.proto=iteron.dev/operator/api/quixos/camino;caminopb"
  "quixos/refs.proto=iteron.dev/operator/api/quixos/quixos;quixospb"
  "quixos/runtime/package_runtime.proto=iteron.dev/operator/api/quixos/quixos/runtime;runtimepb"
)
go_opts=(--go_opt=paths=source_relative)
grpc_opts=(--go-grpc_opt=paths=source_relative)
for m in "${maps[@]}"; do
  go_opts+=(--go_opt="M$m")
  grpc_opts+=(--go-grpc_opt="M$m")
done
protoc \
  --plugin=protoc-gen-go="$gen_go" --plugin=protoc-gen-go-grpc="$gen_grpc" \
  --proto_path="$quixos" \
  --go_out="$quixos" "${go_opts[@]}" \
  --go-grpc_out="$quixos" "${grpc_opts[@]}" \
  camino/api.proto quixos/refs.proto quixos/runtime/package_runtime.proto
