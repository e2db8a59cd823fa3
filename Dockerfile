# syntax=docker/dockerfile:1
#
# The iteron-operator image: the manager (the DaemonSet's one container) and
# the kubectl-iteron CLI beside it, for `kubectl exec` (ledger verify, invoke
# through the node's gateway socket).
#
# `make image` builds the same image without Docker (hack/image:
# go-containerregistry, the same layers), and that is the image `make test`
# runs as a DaemonSet pod on a real node (test/node). This file is for users
# with Docker; the machines this project is tested on have none, so it is not
# built by the project's own tests:
#
#   docker build -t iteron-operator:dev .
#   docker build --target survivor -t iteron-survivor:dev .   # the survivor's image
#
# Building pulls the two base images named below and busybox-static from
# Debian; nothing else is downloaded beyond the Go modules of go.sum.

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
      go build -trimpath -ldflags='-s -w' -o /out/kubectl-iteron ./cmd/kubectl-iteron && \
    CGO_ENABLED=0 GOOS=${TARGETOS} GOARCH=${TARGETARCH} \
      go build -trimpath -ldflags='-s -w' -o /out/iteron-survivor ./cmd/survivor && \
    CGO_ENABLED=0 GOOS=${TARGETOS} GOARCH=${TARGETARCH} \
      go build -trimpath -ldflags='-s -w' -o /out/iteron-sandbox ./cmd/iteron-sandbox

# ---- busybox: the /bin/sh of provider scripts -------------------------------
# The same file `make image` (hack/image) puts in the image: Debian's
# busybox-static, unpacked with dpkg-deb -x.
FROM debian:bookworm-slim AS busybox
RUN apt-get update -q && apt-get download busybox-static && \
    mkdir /out && dpkg-deb -x busybox-static_*.deb /out && \
    mkdir -p /rootfs/bin && cp /out/bin/busybox /rootfs/bin/busybox && \
    for a in $(/rootfs/bin/busybox --list-full); do \
      [ "$a" = bin/busybox ] && continue; \
      mkdir -p "/rootfs/$(dirname "$a")" && \
      ln -s "$(realpath --relative-to="/rootfs/$(dirname "$a")" /rootfs/bin/busybox)" "/rootfs/$a"; \
    done && \
    mkdir -p /rootfs/tmp /rootfs/var/lib/iteron/state /rootfs/var/lib/iteron/providers /rootfs/run/iteron && \
    chmod 1777 /rootfs/tmp

# ---- the survivor (config/manager/survivor.yaml) -----------------------------
# The same busybox layer (provider scripts run in its container), then the
# static iteron-survivor. hack/image -survivor-out builds the same image.
FROM scratch AS survivor
COPY --from=busybox /rootfs/ /
COPY --from=build /out/iteron-survivor /iteron-survivor
COPY --from=build /out/iteron-sandbox /iteron-sandbox
ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
USER 0:0
ENTRYPOINT ["/iteron-survivor"]

# ---- runtime (the manager; the default target) -------------------------------
# Equivalent to `make image` (hack/image), which builds the same image without
# Docker: two layers, the busybox layer (a POSIX /bin/sh for providers written
# as `#!/bin/sh` scripts, the manager's default --interpreters, with busybox's
# applets linked beside it, and the mount points of
# config/manager/daemonset.yaml, which readOnlyRootFilesystem forbids creating
# at run time), then the two static binaries. No libc: the binaries are
# static, and so is busybox.
FROM scratch
COPY --from=busybox /rootfs/ /
COPY --from=build /out/manager /manager
COPY --from=build /out/iteron-sandbox /iteron-sandbox
COPY --from=build /out/kubectl-iteron /usr/local/bin/kubectl-iteron
ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

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
