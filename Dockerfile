# syntax=docker/dockerfile:1
#
# The iteron-operator image: the manager (the DaemonSet's one container) and
# the kubectl-iteron CLI beside it, for `kubectl exec` (ledger verify, invoke
# through the node's gateway socket).
#
# NOT BUILT HERE: the machines this project is developed and tested on have no
# Docker engine, so this file has never been built by the project's own tests.
# It is written for users who have one (hack/kind-e2e.sh builds it):
#
#   docker build -t iteron-operator:dev .
#
# Building pulls the two base images named below; nothing else is downloaded
# beyond the Go modules of go.sum, from the Go module proxy.

# ---- build: static binaries, reproducible paths ------------------------------
FROM golang:1.26-trixie AS build
WORKDIR /src
# Modules first, so a source change does not re-download them.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
# CGO off: static binaries that need no libc from the runtime image.
# -trimpath: no build-machine paths in the binaries (reproducible, and stack
# traces name module paths). TARGETOS/TARGETARCH come from BuildKit, so
# `docker buildx build --platform linux/arm64` cross-compiles.
ARG TARGETOS=linux
ARG TARGETARCH
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=${TARGETOS} GOARCH=${TARGETARCH} \
      go build -trimpath -ldflags='-s -w' -o /out/manager ./cmd/manager && \
    CGO_ENABLED=0 GOOS=${TARGETOS} GOARCH=${TARGETARCH} \
      go build -trimpath -ldflags='-s -w' -o /out/kubectl-iteron ./cmd/kubectl-iteron

# ---- runtime ----------------------------------------------------------------
# Why debian:trixie-slim and not distroless or alpine:
# - Providers run in the manager's filesystem (see below), and providers
#   written as `#!/bin/sh` scripts are common: the manager's default
#   --interpreters is /bin/sh, so the image must have a POSIX /bin/sh. Debian's
#   is dash, plus the coreutils such scripts tend to call (cat, printf, sleep…).
# - distroless/static has no shell at all; its :debug variants add busybox for
#   debugging, not as a supported runtime. Alpine's /bin/sh is busybox ash with
#   busybox's applets, whose small differences from coreutils would surface
#   as provider bugs that do not happen on a Debian or Ubuntu node.
# - It costs tens of megabytes more than distroless; the binaries are
#   static, so no library of the image is linked into the manager.
FROM debian:trixie-slim

# Mount points of config/manager/daemonset.yaml, present even when a hostPath
# is not mounted (readOnlyRootFilesystem forbids creating them at run time).
RUN mkdir -p /var/lib/iteron/state /var/lib/iteron/providers /run/iteron

COPY --from=build /out/manager /manager
COPY --from=build /out/kubectl-iteron /usr/local/bin/kubectl-iteron

# Privileges process management needs (config/manager/daemonset.yaml sets
# them; keep the two in step):
# - The manager runs as root (uid 0) with every capability dropped except
#   SETUID and SETGID (to start providers as --provider-uid/--provider-gid,
#   65534 by default), KILL (to kill a provider's process group after a
#   fault, and re-parented descendants that left the group), DAC_OVERRIDE and
#   FOWNER (the state dir, the ledgers and the gateway socket's ownership).
#   allowPrivilegeEscalation: false is compatible: providers gain nothing by
#   exec, and the manager sets NoNewPrivs on them anyway. Providers run with no
#   capabilities.
# - Providers run in this container's filesystem, mount namespace and PID
#   namespace, as children of the manager: their catalogs and artifact roots
#   must be mounted into the container under --allowed-roots
#   (/var/lib/iteron/providers), a `#!` interpreter must exist in this image
#   (/bin/sh), and their working directory (the artifact root) must be
#   traversable by the provider uid. A provider cannot outlive this pod.
# - The manager is PID 1 of the pod (no init process in front of it): when it
#   exits, the kernel kills every provider of the PID namespace, and
#   providers that escape their process group are re-parented to it anyway
#   (it is also a child subreaper). It reaps only processes of provider groups
#   it recorded, never wait4(-1), so a stray child of a `kubectl exec` session
#   that outlives its parent stays a zombie until the pod restarts.
# - The kernel must allow memfd_create(MFD_EXEC) (vm.memfd_noexec < 2): the
#   verified bytes of each provider are executed from a sealed memfd.
USER 0:0
ENTRYPOINT ["/manager"]
