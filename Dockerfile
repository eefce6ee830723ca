# The one image recipe of a2a-fleet: both binaries are built in one stage, and each image is a
# target of this file (no second recipe anywhere else):
#
#   docker build --target manager              -t a2a-fleet/operator:TAG .
#   docker build --target conversation-service -t a2a-fleet/conversation-service:TAG .
#
# (`make docker-build` builds both.) Static binaries (CGO off) on distroless/static, non-root
# (65532). The base images are referenced by tag: set GO_IMAGE / RUNTIME_IMAGE to a digest
# (name@sha256:...) that your registry reports to pin them. No Docker engine runs on the project's
# CI machines; test/deploy builds the same packages with the same flags and runs them as the
# rendered manifests say (docs/development.md).
ARG GO_IMAGE=golang:1.26
ARG RUNTIME_IMAGE=gcr.io/distroless/static:nonroot

FROM ${GO_IMAGE} AS build
WORKDIR /src
ENV CGO_ENABLED=0 GOTOOLCHAIN=local
# Dependencies first so that source edits reuse the module layer.
COPY go.mod go.sum ./
RUN go mod download
COPY api/ api/
COPY cmd/ cmd/
COPY controllers/ controllers/
COPY internal/ internal/
COPY pkg/ pkg/
ARG TARGETOS=linux
ARG TARGETARCH=amd64
# Keep these flags in step with test/deploy's build (deployBuildFlags), which checks that they match.
RUN GOOS=$TARGETOS GOARCH=$TARGETARCH go build -trimpath -ldflags="-s -w" -o /out/ ./cmd/manager ./cmd/conversation-service

FROM ${RUNTIME_IMAGE} AS conversation-service
COPY --from=build /out/conversation-service /conversation-service
USER 65532:65532
ENTRYPOINT ["/conversation-service"]

# Last, so that a plain `docker build .` still builds the operator (kubebuilder's convention).
FROM ${RUNTIME_IMAGE} AS manager
COPY --from=build /out/manager /manager
USER 65532:65532
ENTRYPOINT ["/manager"]
