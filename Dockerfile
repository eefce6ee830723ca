# The one image recipe of a2a-fleet: every image the manifests run is a target of this file (no
# second recipe anywhere else):
#
#   docker build --target manager              -t a2a-fleet/operator:TAG .
#   docker build --target conversation-service -t a2a-fleet/conversation-service:TAG .
#   docker build --target example-agents       -t a2a-fleet/example-agents:TAG .
#   docker build --target mosquitto            -t a2a-fleet/mosquitto:TAG .
#   docker build --target gateway              -t a2a-fleet/gateway:TAG .
#
# (`make docker-build` builds all five.) The Go binaries are static (CGO off) on distroless/static,
# non-root (65532); Mosquitto is Debian's package on Debian, non-root (1883).
#
# The base images are build arguments whose defaults are the public images a machine with a
# registry pulls; set them to a digest (name@sha256:...) your registry reports to pin them. A
# machine without a registry substitutes images it made itself from Debian's packages
# (hack/kind/rootfs.sh: GO_IMAGE with the machine's own Go, RUNTIME_IMAGE with distroless/static's
# files, DEBIAN_IMAGE from debootstrap); nothing else changes.
ARG GO_IMAGE=golang:1.26
ARG RUNTIME_IMAGE=gcr.io/distroless/static:nonroot
ARG DEBIAN_IMAGE=debian:bookworm-slim
# The release (default: the VERSION file, which the build reads) and the source commit (the build
# context has no .git: `make docker-build` and hack/kind/images.sh pass `git rev-parse HEAD`),
# stamped into the binaries (internal/version) and the images' OCI labels.
ARG VERSION=""
ARG COMMIT=unknown

FROM ${GO_IMAGE} AS build
WORKDIR /src
ENV CGO_ENABLED=0 GOTOOLCHAIN=local
# Dependencies first so that source edits reuse the module layer.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/root/go/pkg/mod go mod download
COPY VERSION ./
COPY api/ api/
COPY cmd/ cmd/
COPY controllers/ controllers/
COPY examples/ examples/
COPY internal/ internal/
COPY pkg/ pkg/
# The chaos suite's agent (test/chaos), shipped in the example-agents image as /chaosagent.
COPY test/chaos/chaosagent/ test/chaos/chaosagent/
ARG TARGETOS=linux
ARG TARGETARCH=amd64
ARG VERSION
ARG COMMIT
RUN --mount=type=cache,target=/root/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    version="${VERSION:-$(cat VERSION)}" && \
    GOOS=$TARGETOS GOARCH=$TARGETARCH go build -trimpath -o /out/ \
    -ldflags="-s -w -X github.com/a2a-fleet/a2a-fleet/internal/version.Version=${version} -X github.com/a2a-fleet/a2a-fleet/internal/version.Commit=${COMMIT}" \
    ./cmd/manager ./cmd/conversation-service ./cmd/gateway ./examples/confirm ./examples/echo ./examples/memory \
    ./test/chaos/chaosagent

FROM ${RUNTIME_IMAGE} AS conversation-service
ARG VERSION
ARG COMMIT
LABEL org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${COMMIT}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/a2a-fleet/a2a-fleet" \
      org.opencontainers.image.title="a2a-fleet conversation service"
COPY --from=build /out/conversation-service /conversation-service
USER 65532:65532
ENTRYPOINT ["/conversation-service"]

# The decision service (cmd/decision-service): a broker cluster's HTTP authentication and
# authorization from the operator's decision table (config/decision-service, the chart's
# decisionService). Its own build stage on the builder's layers and caches, so the targets above
# do not compile it:
#   docker build --target decision-service -t a2a-fleet/decision-service:TAG .
FROM build AS decision-service-build
ARG TARGETOS=linux
ARG TARGETARCH=amd64
ARG VERSION
ARG COMMIT
RUN --mount=type=cache,target=/root/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    version="${VERSION:-$(cat VERSION)}" && \
    GOOS=$TARGETOS GOARCH=$TARGETARCH go build -trimpath -o /out/decision-service \
    -ldflags="-s -w -X github.com/a2a-fleet/a2a-fleet/internal/version.Version=${version} -X github.com/a2a-fleet/a2a-fleet/internal/version.Commit=${COMMIT}" \
    ./cmd/decision-service

FROM ${RUNTIME_IMAGE} AS decision-service
ARG VERSION
ARG COMMIT
LABEL org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${COMMIT}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/a2a-fleet/a2a-fleet" \
      org.opencontainers.image.title="a2a-fleet decision service"
COPY --from=decision-service-build /out/decision-service /decision-service
USER 65532:65532
ENTRYPOINT ["/decision-service"]

# The HTTP gateway (cmd/gateway, docs/gateway.md): the optional config/gateway, the chart's
# gateway.enabled.
FROM ${RUNTIME_IMAGE} AS gateway
ARG VERSION
ARG COMMIT
LABEL org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${COMMIT}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/a2a-fleet/a2a-fleet" \
      org.opencontainers.image.title="a2a-fleet HTTP gateway"
COPY --from=build /out/gateway /gateway
USER 65532:65532
ENTRYPOINT ["/gateway"]

# The example agents of config/samples (examples/): one image, the Agent's workload names the
# binary (/confirm, /echo, /memory); each reads its identity and credentials from what the
# operator injects (A2A_* variables, docs/registration.md). /chaosagent is the chaos suite's
# agent (test/chaos/chaosagent: it journals every execution and drains on SIGTERM).
FROM ${RUNTIME_IMAGE} AS example-agents
ARG VERSION
ARG COMMIT
LABEL org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${COMMIT}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/a2a-fleet/a2a-fleet" \
      org.opencontainers.image.title="a2a-fleet example agents"
COPY --from=build /out/confirm /out/echo /out/memory /out/chaosagent /
USER 65532:65532
ENTRYPOINT ["/echo"]

# The plugin that stamps the authenticated publisher on every message (docs/security.md), built by
# the same script as the tests' copy, against Debian's Mosquitto 2.0 headers.
FROM ${DEBIAN_IMAGE} AS mosquitto-plugin
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev mosquitto-dev libmosquitto-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY hack/build-mosquitto-plugin.sh hack/
COPY hack/mosquitto-plugin/ hack/mosquitto-plugin/
RUN OUT=/out/mosquitto_a2a_fleet_sender.so hack/build-mosquitto-plugin.sh

# The decision-table plugin (docs/broker.md): Go built with cgo as a c-shared library, by the same
# script as the tests' copy. It is built on the runtime's Debian (its glibc and Mosquitto 2.0
# headers are the ones the broker image loads it with) with the Go toolchain of GO_IMAGE.
FROM ${GO_IMAGE} AS go-toolchain
FROM ${DEBIAN_IMAGE} AS mosquitto-table-plugin
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev mosquitto-dev libmosquitto-dev ca-certificates \
    && rm -rf /var/lib/apt/lists/*
COPY --from=go-toolchain /usr/local/go /usr/local/go
ENV PATH=/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin GOTOOLCHAIN=local GOFLAGS=-buildvcs=false
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/root/go/pkg/mod go mod download
COPY api/ api/
COPY internal/ internal/
COPY pkg/ pkg/
COPY hack/build-mosquitto-table-plugin.sh hack/
COPY hack/mosquitto-plugin/table/ hack/mosquitto-plugin/table/
RUN --mount=type=cache,target=/root/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    OUT=/out/mosquitto_a2a_fleet_table.so hack/build-mosquitto-table-plugin.sh

# Mosquitto 2 (Debian's package) with its dynamic-security plugin and the project's two plugins
# (the sender stamp, the decision table), at the paths config/mosquitto/mosquitto.conf names.
FROM ${DEBIAN_IMAGE} AS mosquitto
ARG VERSION
ARG COMMIT
LABEL org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${COMMIT}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/a2a-fleet/a2a-fleet" \
      org.opencontainers.image.title="a2a-fleet Mosquitto"
RUN apt-get update && apt-get install -y --no-install-recommends mosquitto mosquitto-clients \
    && rm -rf /var/lib/apt/lists/* \
    && ln -s /usr/lib/*-linux-gnu/mosquitto_dynamic_security.so /usr/lib/mosquitto_dynamic_security.so \
    && test -e /usr/lib/mosquitto_dynamic_security.so \
    && groupadd --system --gid 1883 mosquitto-a2a && useradd --system --uid 1883 --gid 1883 --no-create-home mosquitto-a2a \
    && mkdir -p /mosquitto/config /mosquitto/data && chown 1883:1883 /mosquitto/data
COPY --from=mosquitto-plugin /out/mosquitto_a2a_fleet_sender.so /usr/lib/
COPY --from=mosquitto-table-plugin /out/mosquitto_a2a_fleet_table.so /usr/lib/
USER 1883:1883
ENTRYPOINT ["/usr/sbin/mosquitto"]
CMD ["-c", "/mosquitto/config/mosquitto.conf"]

# Last, so that a plain `docker build .` still builds the operator (kubebuilder's convention).
FROM ${RUNTIME_IMAGE} AS manager
ARG VERSION
ARG COMMIT
LABEL org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${COMMIT}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/a2a-fleet/a2a-fleet" \
      org.opencontainers.image.title="a2a-fleet operator"
COPY --from=build /out/manager /manager
USER 65532:65532
ENTRYPOINT ["/manager"]
