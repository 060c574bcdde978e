# fleetgraph's container image: `make image` builds it (docker or podman).
#
# Stage 1 builds one static binary (no cgo; the dashboard's assets in ui/dist
# are committed and embedded). Stage 2 is distroless "static", which has CA
# certificates and a passwd entry for the nonroot user (65532) and nothing
# else: no shell, no package manager. The chart runs it read-only, as
# non-root, with every capability dropped.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 GOOS=linux go build -trimpath -ldflags "-s -w" -o /out/fleetgraph ./cmd/fleetgraph

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/fleetgraph /usr/local/bin/fleetgraph
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/fleetgraph"]
CMD ["serve"]
