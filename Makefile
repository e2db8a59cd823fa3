# iteron-operator. `make` alone lists the targets.
#
# Every tool comes from the Go module proxy (go.mod `tool` directives, run with
# `go tool`) or from hack/; nothing is downloaded from anywhere else.

SHELL := /usr/bin/env bash -o pipefail
.SHELLFLAGS := -ec

BIN_DIR ?= $(CURDIR)/bin
K8S_BIN_DIR ?= $(BIN_DIR)/k8s
NODE_BIN_DIR ?= $(BIN_DIR)/node
export KUBEBUILDER_ASSETS ?= $(K8S_BIN_DIR)
GO ?= go
GO_TEST_FLAGS ?=
CONTROLLER_GEN := $(GO) tool controller-gen

.DEFAULT_GOAL := help

##@ General

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*##"; printf "Usage: make \033[36m<target>\033[0m\n"} /^[a-zA-Z_0-9-]+:.*?##/ { printf "  \033[36m%-18s\033[0m %s\n", $$1, $$2 } /^##@/ { printf "\n\033[1m%s\033[0m\n", substr($$0, 5) } ' $(MAKEFILE_LIST)

##@ Development

.PHONY: generate
generate: manifests generate-proto ## Generate deepcopy code, CRDs, RBAC, the API and reason references and the gateway's gRPC code.
	$(CONTROLLER_GEN) object:headerFile=hack/boilerplate.go.txt paths=./api/...
	$(GO) run ./hack/apiref -crds config/crd/bases -out docs/reference/api.md
	$(GO) run ./hack/reasonsdoc -out docs/reference/reasons.md

.PHONY: generate-proto
generate-proto: ## Generate api/gateway/v1 from gateway.proto and api/quixos from the package-runtime service (Debian's protoc, installed when missing; pinned protoc-gen-go/-go-grpc).
	hack/generate-proto.sh

.PHONY: manifests
manifests: ## Generate CRDs (config/crd/bases), the node manager's RBAC (config/rbac/role.yaml) and the fleet controller's (config/fleet/role.yaml).
	$(CONTROLLER_GEN) crd paths=./api/... output:crd:artifacts:config=config/crd/bases
	$(CONTROLLER_GEN) rbac:roleName=iteron-manager paths=./controllers output:rbac:artifacts:config=config/rbac
	$(CONTROLLER_GEN) rbac:roleName=iteron-fleet paths=./controllers/fleet output:rbac:artifacts:config=config/fleet

.PHONY: verify-generated
verify-generated: ## Fail when committed generated files differ from what `make generate` writes.
	hack/verify-generated.sh

.PHONY: verify-tidy
verify-tidy: ## Fail when a go.mod (the root module's, or a wrapper module's under hack/) is not tidy (`go mod tidy -diff` in each; builds nothing).
	hack/verify-tidy.sh

.PHONY: fmt
fmt: ## Run gofmt on the tree.
	gofmt -w $$(git ls-files '*.go')

.PHONY: vet
vet: ## Run go vet.
	$(GO) vet ./...

.PHONY: build
build: ## Build the manager, its sandbox launcher and the kubectl plugin into bin/.
	$(GO) build -o $(BIN_DIR)/manager ./cmd/manager
	CGO_ENABLED=0 $(GO) build -o $(BIN_DIR)/iteron-sandbox ./cmd/iteron-sandbox
	$(GO) build -o $(BIN_DIR)/kubectl-iteron ./cmd/kubectl-iteron

.PHONY: controlplane
controlplane: ## Build etcd, kube-apiserver and kubectl v1.37.2 into bin/k8s (once; from the Go module proxy).
	hack/build-controlplane.sh

.PHONY: registry
registry: ## Build the CNCF distribution registry (hack/registry/go.mod's version) into bin/registry (once; Go module proxy).
	REGISTRY_BIN=$(BIN_DIR)/registry hack/build-registry.sh

.PHONY: prometheus
prometheus: ## Build Prometheus (hack/prometheus/go.mod's version, -tags remove_all_sd) into bin/prometheus (once; Go module proxy): test/fleetanalysis scrapes the managers with it.
	PROMETHEUS_BIN=$(BIN_DIR)/prometheus hack/build-prometheus.sh

.PHONY: node
node: ## Build kubelet, controller-manager, scheduler, kube-proxy v1.37.2, containerd, runc and CNI into bin/node (once; Go module proxy; Debian packages it needs).
	NODE_BIN_DIR=$(NODE_BIN_DIR) hack/build-node.sh

.PHONY: image
image: ## Build the manager's and the survivor's images (and the local node's pause image) without Docker into bin/image/.
	$(GO) run ./hack/image -out $(BIN_DIR)/image/iteron-operator.tar -survivor-out $(BIN_DIR)/image/iteron-survivor.tar -pause-out $(BIN_DIR)/image/pause.tar -debs $(BIN_DIR)/image/debs

##@ Test

.PHONY: test
test: controlplane node registry prometheus verify-generated verify-tidy vet ## Unit tests, envtest suites against the real API server, the e2e suite and the DaemonSet on a real node (test/node).
	@gofmt_out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$gofmt_out" ]; then echo "gofmt would change: $$gofmt_out"; exit 1; fi
	GO_TEST_FLAGS="$(GO_TEST_FLAGS)" hack/test.sh ./...

.PHONY: fleet
fleet: controlplane prometheus ## The ActivationSet suites alone, verbose: test/fleet (six managers, two fleet controllers: the wave log, pids, state per node and the failure table), test/fleetanalysis (three managers scraped by Prometheus: analyses, probes, cohorts, pause/promote) and test/fleetscale (1 000 nodes: controller time and API writes per node). make test runs them.
	$(GO) test $(GO_TEST_FLAGS) -count=1 -v -timeout 10m ./test/fleet/
	$(GO) test $(GO_TEST_FLAGS) -count=1 -v -timeout 10m ./test/fleetanalysis/
	$(GO) test $(GO_TEST_FLAGS) -count=1 -v -timeout 8m ./test/fleetscale/

.PHONY: faults
faults: controlplane ## The full ledger-fault tables (root, /dev/fuse): every phase of every transaction kind fails its ledger append (ENOSPC, EIO) on a FUSE file system, in-process (internal/hotswap) and through the manager binary, API server and gateway (test/crash). make test runs a subset.
	ITERON_FAULTS=all $(GO) test $(GO_TEST_FLAGS) -count=1 -v -timeout 10m -run '^TestALedgerAppendThatFails' ./internal/hotswap
	ITERON_FAULTS=all $(GO) test $(GO_TEST_FLAGS) -count=1 -v -timeout 18m -run '^(TestALedgerThatCannotBeWritten|TestARestartBeforeTheLedgerHeals)' ./test/crash

.PHONY: test-sandbox
test-sandbox: controlplane ## The sandbox (root): the whole hostile-provider table through the manager (test/sandbox, with a network namespace of its own), the launcher, cgroups and profile tests (internal/sandbox). make test runs a named subset.
	ITERON_SANDBOX_FULL=1 $(GO) test $(GO_TEST_FLAGS) -count=1 -v -timeout 10m ./test/sandbox/ ./internal/sandbox/...

BENCH_COUNT ?= 5
.PHONY: bench-sandbox
bench-sandbox: controlplane ## The sandbox's costs (root): Launch + Load sandboxed ÷ unsandboxed, cold, warm and in a burst, with the median of each step; one call start → terminal with and without it; a neighbour's call p99 beside a CPU spinner ÷ alone; medians of BENCH_COUNT runs.
	$(GO) test -count=$(BENCH_COUNT) -run '^$$' -bench '^BenchmarkSandboxedLaunch$$' -benchtime 30x -timeout 10m ./internal/procexec/ | tee /dev/stderr | $(GO) run ./bench/benchmed
	$(GO) test -count=$(BENCH_COUNT) -run '^$$' -bench '^BenchmarkSandboxedStartToTerminal$$' -benchtime 2000x -timeout 10m ./internal/procexec/ | tee /dev/stderr | $(GO) run ./bench/benchmed
	$(GO) test -count=$(BENCH_COUNT) -run '^$$' -bench '^BenchmarkNeighbourLatencyBesideACPUSpinner$$' -benchtime 300x -timeout 10m ./test/sandbox/ | grep -v '^{"level"' | tee /dev/stderr | $(GO) run ./bench/benchmed

.PHONY: bench-activation
bench-activation: ## Parallel activation: apply → all 28 family modules Active, --max-parallel-activations=1 ÷ the default, and plan computation for 28 and 64 modules; medians of BENCH_COUNT runs.
	$(GO) test -count=$(BENCH_COUNT) -run '^$$' -bench '^BenchmarkFamilyApply$$' -benchtime 3x -timeout 15m ./bench/ | $(GO) run ./bench/benchmed
	$(GO) test -count=$(BENCH_COUNT) -run '^$$' -bench '^BenchmarkPlan$$' -benchtime 2000x -timeout 5m ./internal/graph/ | $(GO) run ./bench/benchmed

.PHONY: bench-pkgruntime
bench-pkgruntime: ## Package runtimes: Invoke to the kv runtime through the gateway ÷ a bare grpc-go call to the same runtime binary, and a flooding Watch's events per second through the gateway alone and beside a slow caller; medians of BENCH_COUNT runs.
	$(GO) test -count=$(BENCH_COUNT) -run '^$$' -bench '^BenchmarkPackageInvoke$$' -benchtime 2000x -timeout 10m ./internal/gateway/ | $(GO) run ./bench/benchmed
	$(GO) test -count=$(BENCH_COUNT) -run '^$$' -bench '^BenchmarkPackageWatchEvents$$' -benchtime 3x -timeout 10m ./internal/gateway/ | $(GO) run ./bench/benchmed

BENCH_APPLY_COUNT ?= 3
.PHONY: bench-apply
bench-apply: controlplane ## Apply latency on one manager: 11 activations × 28 counter providers, apply → Ready of the first and the eleventh, API requests per module, RSS with 280 providers; BENCH_APPLY_COUNT runs, each its own test binary, control plane and manager (≈ 1 min each, ~300 providers and ~2 GiB at the peak).
	for i in $$(seq $(BENCH_APPLY_COUNT)); do $(GO) test -count=1 -run '^$$' -bench '^BenchmarkApplyScale$$' -benchtime 1x -v -timeout 5m ./test/applyscale/ || exit 1; done | grep -v '^{"level"' | $(GO) run ./bench/benchmed

.PHONY: e2e
e2e: controlplane ## The end-to-end suite (against $$KUBECONFIG when set, else the local control plane).
	$(GO) test $(GO_TEST_FLAGS) -count=1 ./test/e2e/...

.PHONY: e2e-node
e2e-node: controlplane node ## The DaemonSet on a real local node (test/node) alone, printing the node's state at each step (root).
	$(GO) test $(GO_TEST_FLAGS) -count=1 -v -timeout 20m ./test/node/

##@ Run

.PHONY: demo
demo: controlplane registry ## The guided demo: a local control plane and registry, providers pushed as OCI artifacts, the manager, an activation by digest, a call, a stateful hot swap, the ledger.
	$(GO) run ./hack/demo

.PHONY: clean
clean: ## Remove build outputs (bin/), keeping the control-plane binaries unless CLEAN_K8S=1.
	@if [ "$(CLEAN_K8S)" = 1 ]; then rm -rf $(BIN_DIR); else find $(BIN_DIR) -mindepth 1 -maxdepth 1 ! -name k8s -exec rm -rf {} + 2>/dev/null || true; fi
