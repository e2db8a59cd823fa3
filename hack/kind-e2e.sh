#!/usr/bin/env bash
# hack/kind-e2e.sh: run the DaemonSet test (test/node) and the end-to-end
# suite (test/e2e) against a throwaway kind cluster, with the manager deployed
# from config/default as a real DaemonSet.
#
# UNTESTED HERE. The machines this project is developed and tested on have no
# Docker engine, so kind cannot run there and this script has never been run by
# the project itself: it is written for users who have Docker. `make test` runs
# test/node on a real local node (kubelet, containerd and runc built from the
# Go module proxy: test/localnode) and test/e2e against the local control
# plane instead. If something here breaks for you, the step it names is the
# place to look.
#
# What it does, in order (each step prints a line):
#   1. creates a kind cluster (one node, its own kubeconfig in a temp dir), with
#      a directory of this machine mounted at the same path in the node: the
#      DaemonSet's hostPath volumes of test/node live there, so the test lays
#      out providers and calls the gateway socket from this machine (a unix
#      socket through a bind mount: Docker on Linux);
#   2. builds the image from the Dockerfile (or, with IMAGE_ARCHIVE, loads the
#      tarball `make image` writes without Docker) and loads it into the node;
#   2b. runs test/node against the cluster (it applies config/default with its
#      host paths in the mounted directory, and checks the DaemonSet, a swap,
#      pod deletion and rollout restart, probes and metrics);
#   3. builds the example providers and their catalogs with hack/catalog (the
#      catalog generator) and copies them into the node's
#      /var/lib/iteron/providers, which the DaemonSet mounts (hostPath);
#   4. deploys config/default (CRDs, RBAC, admission policy, DaemonSet) and
#      waits for the manager to be ready;
#   5. runs `go test ./test/e2e/...` with KUBECONFIG pointing at the cluster;
#   6. deletes the cluster and the temp dir, on success, failure or Ctrl-C.
#
# Requirements: a running Docker engine, kind (whose node image must be
# Kubernetes 1.32 or newer: the CRDs use selectable fields), kubectl (for
# `apply --server-side -k`), Go 1.26.
#
# Downloads: kind pulls its node image and `docker build` pulls the two base
# images named in the Dockerfile; Go modules come from the Go module proxy as
# for any build. The script itself downloads nothing.
#
# Environment:
#   KIND_CLUSTER     cluster name (default iteron-e2e); must not exist yet
#   KIND_NODE_IMAGE  node image for `kind create cluster --image` (default: kind's)
#   IMAGE            image to build and deploy (default iteron-operator:dev,
#                    the DaemonSet's own)
#   IMAGE_ARCHIVE    an image tarball to load instead of `docker build`
#                    (bin/image/iteron-operator.tar from `make image`)
#   KEEP_CLUSTER=1   keep the cluster afterwards (for debugging)
#   E2E_FLAGS        extra `go test` flags, e.g. "-v -run TestSwap"
#
# The suite is told where it runs through these variables:
#   KUBECONFIG                   the kind cluster
#   ITERON_E2E_NODE_NAME         the node whose manager runs the activations
#   ITERON_E2E_PROVIDER_ROOT     where the catalogs and artifacts are on that node
#   ITERON_E2E_MANAGER_NAMESPACE the manager DaemonSet's namespace (for
#                                `kubectl exec … kubectl-iteron`, which the image carries)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cluster=${KIND_CLUSTER:-iteron-e2e}
image=${IMAGE:-iteron-operator:dev}
default_image=iteron-operator:dev
manager_ns=iteron-system
provider_root=/var/lib/iteron/providers
artifacts="$root/test/e2e/_artifacts/kind"

step() { printf '\n==> %s\n' "$*"; }
die() { printf 'kind-e2e: %s\n' "$*" >&2; exit 1; }

for tool in docker kind kubectl go; do
  command -v "$tool" >/dev/null 2>&1 || die "$tool is not on PATH (this script needs docker, kind, kubectl and go)"
done
docker info >/dev/null 2>&1 || die "the Docker engine is not reachable (docker info failed)"
if kind get clusters 2>/dev/null | grep -qx -- "$cluster"; then
  die "a kind cluster named $cluster already exists; delete it (kind delete cluster --name $cluster) or set KIND_CLUSTER"
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/iteron-kind-e2e.XXXXXX")
kubeconfig="$work/kubeconfig"
created=0

cleanup() {
  local status=$?
  trap - EXIT INT TERM
  if [ "$status" -ne 0 ] && [ "$created" = 1 ]; then
    # Keep what explains the failure before the cluster goes.
    mkdir -p "$artifacts"
    kubectl --kubeconfig "$kubeconfig" -n "$manager_ns" logs daemonset/iteron-manager --tail=500 \
      >"$artifacts/manager.log" 2>&1 || true
    kubectl --kubeconfig "$kubeconfig" get implementationactivations,generations -A -o yaml \
      >"$artifacts/objects.yaml" 2>&1 || true
    kubectl --kubeconfig "$kubeconfig" get events -A --sort-by=.lastTimestamp \
      >"$artifacts/events.txt" 2>&1 || true
    echo "kind-e2e: failed (exit $status); manager log, objects and events are in $artifacts" >&2
  fi
  if [ "$created" = 1 ]; then
    if [ "${KEEP_CLUSTER:-}" = 1 ]; then
      echo "kind-e2e: keeping cluster $cluster (KUBECONFIG=$kubeconfig); delete it with: kind delete cluster --name $cluster"
      work=""
    else
      step "deleting kind cluster $cluster"
      kind delete cluster --name "$cluster" || echo "kind-e2e: could not delete cluster $cluster" >&2
    fi
  fi
  [ -z "$work" ] || rm -rf "$work"
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

kc() { kubectl --kubeconfig "$kubeconfig" "$@"; }

step "1/6 creating kind cluster $cluster"
# test/node's hostPath volumes: the same path here and in the node.
node_root="$work/node-root"
mkdir -p "$node_root"
chmod 755 "$work" "$node_root"
cat >"$work/kind.yaml" <<KIND
kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
nodes:
- role: control-plane
  extraMounts:
  - hostPath: $node_root
    containerPath: $node_root
KIND
created=1
kind create cluster --name "$cluster" --kubeconfig "$kubeconfig" --wait 180s --config "$work/kind.yaml" \
  ${KIND_NODE_IMAGE:+--image "$KIND_NODE_IMAGE"}
node="$cluster-control-plane"
server_minor=$(kc version -o json | sed -n '/"serverVersion"/,/}/s/.*"minor": *"\([0-9]*\).*/\1/p')
[ -n "$server_minor" ] || die "could not read the cluster's Kubernetes version"
[ "$server_minor" -ge 32 ] || die "the kind node runs Kubernetes 1.$server_minor; the CRDs need 1.32 or newer (set KIND_NODE_IMAGE)"
# A one-node kind cluster schedules workloads on its control plane; remove the
# taint if this kind version still sets it, so the DaemonSet lands.
if kc get node "$node" -o jsonpath='{.spec.taints[*].key}' | grep -q 'node-role.kubernetes.io/control-plane'; then
  kc taint node "$node" node-role.kubernetes.io/control-plane:NoSchedule-
fi

step "2/6 building image $image and loading it into $node"
if [ -n "${IMAGE_ARCHIVE:-}" ]; then
  kind load image-archive "$IMAGE_ARCHIVE" --name "$cluster"
  # The survivor's image (config/manager/survivor.yaml), written beside it by
  # `make image`.
  kind load image-archive "${SURVIVOR_IMAGE_ARCHIVE:-$(dirname "$IMAGE_ARCHIVE")/iteron-survivor.tar}" --name "$cluster"
else
  docker build -t "$image" "$root"
  kind load docker-image "$image" --name "$cluster"
  docker build --target survivor -t iteron-survivor:dev "$root"
  kind load docker-image iteron-survivor:dev --name "$cluster"
fi

step "2b/6 running the DaemonSet test (test/node) against $cluster"
(cd "$root" && KUBECONFIG="$kubeconfig" ITERON_NODE_NAME="$node" ITERON_NODE_ROOT="$node_root" \
  go test -count=1 -v -timeout 20m ./test/node/)

step "3/6 building the example providers and catalogs into $node:$provider_root"
[ -d "$root/hack/catalog" ] || die "hack/catalog (the catalog generator) is missing from this checkout"
case "$(docker exec "$node" uname -m)" in
  x86_64) node_arch=amd64 ;;
  aarch64 | arm64) node_arch=arm64 ;;
  *) die "unsupported node architecture: $(docker exec "$node" uname -m)" ;;
esac
# The generator runs on this machine, but the providers it builds run on the
# node: build the generator for the host, then run it with GOOS/GOARCH set so
# the `go build` it spawns targets the node. (`go run ./hack/catalog` with
# GOOS=linux would build the generator itself for the node and fail to start
# on a non-Linux host.)
(cd "$root" && go build -o "$work/catalog-gen" ./hack/catalog)
(cd "$root" && GOOS=linux GOARCH="$node_arch" CGO_ENABLED=0 "$work/catalog-gen" -out "$work/providers" -modules prompt_system,context_assembly >"$work/sources.json")
docker exec "$node" mkdir -p "$provider_root"
docker cp "$work/providers/." "$node:$provider_root/"
# Providers run as uid 65534: every directory must be traversable and every
# file readable by it; nothing may be writable by it.
docker exec "$node" chown -R root:root "$provider_root"
docker exec "$node" chmod -R u+rwX,go+rX,go-w "$provider_root"

step "4/6 deploying config/default"
kc apply --server-side -k "$root/config/default"
if [ "$image" != "$default_image" ]; then
  kc -n "$manager_ns" set image daemonset/iteron-manager manager="$image"
fi
# The suite calls the gateway from inside the manager pod (kubectl exec, as
# root): allow uid 0 for the namespace it uses.
kc -n "$manager_ns" patch daemonset/iteron-manager --type=json \
  -p '[{"op":"add","path":"/spec/template/spec/containers/0/args/-","value":"--gateway-allow=uid:0=default"}]'
kc -n "$manager_ns" rollout status daemonset/iteron-manager --timeout=180s

step "5/6 running the e2e suite against $cluster"
read -r -a e2e_flags <<<"${E2E_FLAGS:-}"
(cd "$root" && KUBECONFIG="$kubeconfig" \
  ITERON_E2E_NODE_NAME="$node" \
  ITERON_E2E_PROVIDER_ROOT="$provider_root" \
  ITERON_E2E_MANAGER_NAMESPACE="$manager_ns" \
  ITERON_E2E_SOURCES="$work/sources.json" \
  ITERON_E2E_LOCAL_PROVIDERS="$work/providers" \
  go test -count=1 "${e2e_flags[@]}" ./test/e2e/...)

step "6/6 the e2e suite passed on kind; cleaning up"
