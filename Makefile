# fleetgraph make targets. `make test` and `make demo` set up everything a
# fresh machine needs; nothing here downloads anything but Go modules, the
# npm packages pinned in graph/conformance/package-lock.json and
# ui/package-lock.json, and Debian's chromium for the browser test.

SHELL := /bin/bash
GO ?= go
BIN := $(CURDIR)/bin
TESTENV := $(BIN)/kube-testenv
GOLANGCI_LINT_VERSION := v2.6.2
GOLANGCI_LINT := $(BIN)/golangci-lint-$(GOLANGCI_LINT_VERSION)
# Helm, built from the version tools/helm/go.mod pins (no prebuilt download);
# its default Kubernetes version is set as Helm's own Makefile sets it.
HELM := $(BIN)/helm
HELM_LDFLAGS := -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=35 \
	-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=35
CHART := charts/fleetgraph
DOCKERFILE_LINT := tools/dockerfile-lint/node_modules/.bin/dockerfile-utils
# The image `make image` builds; the chart's default image (values.yaml) names it.
CONTAINER_ENGINE ?= docker
IMAGE ?= ghcr.io/fleetgraph/fleetgraph:$(shell sed -n 's/^appVersion: *"\(.*\)"/\1/p' charts/fleetgraph/Chart.yaml)

# Tests find the control-plane binary and Helm here, whatever their working directory.
export FLEETGRAPH_TESTENV := $(TESTENV)
export FLEETGRAPH_HELM := $(HELM)

# The Kubernetes version kube-testenv reports (k8s.io/kubernetes is built as a
# library, so its version stamp has to be set here).
KUBE_VERSION := v1.35.4
TESTENV_LDFLAGS := -X k8s.io/component-base/version.gitVersion=$(KUBE_VERSION) \
	-X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=35

# The Node packages of graph/conformance (graphql-http, graphql-ws), from its
# lock file; the conformance tests need them.
CONFORMANCE_DEPS := graph/conformance/node_modules/.package-lock.json

# The dashboard's Node packages (Svelte, Vite, Vitest, GraphiQL, Playwright's
# driver and axe-core), from its lock file.
UI_DEPS := ui/node_modules/.package-lock.json
# Debian's Chromium for the dashboard's browser test (cmd/fleetgraph TestDemo
# drives it with playwright-core); installed once, as root.
CHROMIUM := /usr/bin/chromium

TESTENV_SRC := $(shell find testenv -name '*.go' -not -name '*_test.go' -not -path '*/rbacdiff/*') testenv/go.mod testenv/go.sum Makefile

.PHONY: all build test test-unit test-root test-testenv test-fleetbench test-chart chart-rbac helm image lint-dockerfile test-fuzz check-generated lint demo testenv crds \
	bench-index bench-scale bench-authz bench-collector bench-fleet bench-edge bench-replication bench-graph bench-isolation bench-ui bench-compare bench-servers test-rbac-full test-conformance clean

all: build

build:
	$(GO) build ./...

## testenv: build the real kube-apiserver + etcd binary (only when its sources changed)
testenv: $(TESTENV)

$(TESTENV): $(TESTENV_SRC)
	@mkdir -p $(BIN)
	@echo "building kube-testenv (k8s.io/kubernetes; about 6 minutes cold), progress every 100 packages..."
	@# go build -v names each package it compiles: count them against the
	@# dependencies, so a long cold build shows that it moves.
	cd testenv && set -o pipefail && total=$$($(GO) list -deps ./cmd/kube-testenv | wc -l) && \
		$(GO) build -v -ldflags "$(TESTENV_LDFLAGS)" -o $(TESTENV) ./cmd/kube-testenv 2>&1 | \
		awk -v total=$$total '/^[A-Za-z0-9._~\/-]+$$/ { n++; if (n % 100 == 0) printf "  kube-testenv: %d of %d packages compiled\n", n, total; next } { print }'
	@touch $(TESTENV)

## test: every test of every module with the race detector, brief fuzzing, helm lint and template of the chart,
## the Dockerfile's lint, make lint, and a check that generated code is current
test: testenv test-ui test-chart lint-dockerfile test-root test-testenv test-fleetbench test-fuzz lint check-generated

test-root: $(CONFORMANCE_DEPS) $(HELM) $(UI_DEPS) $(CHROMIUM)
	FLEETGRAPH_CONFORMANCE=1 FLEETGRAPH_BROWSER=1 $(GO) test -race -timeout 30m ./...

test-testenv:
	cd testenv && $(GO) test -race -timeout 20m ./...
	cd testenv/rbacdiff/querypath && $(GO) vet ./... && $(GO) test -race -timeout 20m ./...

# cmd/fleetbench is a module of its own, so that the drivers and the
# plotting library of the comparison stay out of the root go.mod.
test-fleetbench: bench-servers
	cd cmd/fleetbench && $(GO) vet ./... && $(GO) test -race ./...

.PHONY: ui test-ui docs

## docs: regenerate docs/configuration.md from the commands' flags (a test checks it is current)
docs:
	$(GO) run ./cmd/fleetgraph reference > docs/configuration.md

## ui: rebuild the dashboard (ui/dist, committed and embedded) from its sources
ui: $(UI_DEPS)
	cd ui && npm run build --silent

## test-ui: the dashboard's unit tests, and a check that the committed ui/dist
## is exactly the build of the sources (the build is deterministic)
test-ui: $(UI_DEPS)
	cd ui && npx vitest run && npx svelte-check --tsconfig ./tsconfig.json --threshold error
	rm -rf $(BIN)/ui-dist
	cd ui && npm run build --silent -- --outDir $(BIN)/ui-dist --emptyOutDir --logLevel warn
	@diff -r ui/dist $(BIN)/ui-dist >/dev/null || { diff -r ui/dist $(BIN)/ui-dist | head -20; \
		echo "ui/dist is not the build of ui/src: run 'make ui' and commit ui/dist"; exit 1; }

$(CHROMIUM):
	@echo "installing Debian's chromium for the browser test..."
	apt-get update -qq && apt-get install -y -qq chromium

# npm install with the committed lock, not npm ci: the registry these
# machines reach serves only the linux-x64 builds of Rollup and esbuild, so
# the lock cannot list the other platforms' optional packages, which npm ci
# insists on. --no-save keeps the lock as committed; it pins every version.
$(UI_DEPS): ui/package-lock.json
	npm install --prefix ui --no-save --no-audit --no-fund
	@touch $(UI_DEPS)

## helm: build bin/helm from the version tools/helm/go.mod pins
helm: $(HELM)

$(HELM): tools/helm/go.mod tools/helm/go.sum
	@mkdir -p $(BIN)
	@echo "building helm (helm.sh/helm/v3, pinned in tools/helm/go.mod)..."
	cd tools/helm && $(GO) build -ldflags "$(HELM_LDFLAGS)" -o $(HELM) helm.sh/helm/v3/cmd/helm
	@touch $(HELM)

## chart-rbac: regenerate the chart's RBAC rules from `fleetgraph rbac --helm-template`
chart-rbac:
	$(GO) run ./cmd/fleetgraph rbac --helm-template > $(CHART)/templates/_rbac.tpl

## test-chart: helm lint and helm template of charts/fleetgraph in each mode and HA (the Go tests check what they render)
test-chart: $(HELM)
	$(HELM) lint --strict $(CHART)
	$(HELM) lint --strict $(CHART) --set mode=leaf
	$(HELM) lint --strict $(CHART) --set mode=edge --set edge.managerURL=https://fleetgraph.example.com/edge --set edge.cluster=leaf-1 --set edge.tokenSecret=edge-token
	$(HELM) template fleetgraph $(CHART) --namespace fleetgraph > /dev/null
	$(HELM) template fleetgraph $(CHART) --namespace fleetgraph --set mode=leaf > /dev/null
	$(HELM) lint --strict $(CHART) --set ha.enabled=true --set ha.nats.url=nats://nats.nats:4222
	$(HELM) template fleetgraph $(CHART) --namespace fleetgraph --set ha.enabled=true --set ha.nats.url=nats://nats.nats:4222 > /dev/null

## lint-dockerfile: dockerfile-utils (pinned in tools/dockerfile-lint) over the Dockerfile
lint-dockerfile: $(DOCKERFILE_LINT)
	$(DOCKERFILE_LINT) lint Dockerfile

$(DOCKERFILE_LINT): tools/dockerfile-lint/package-lock.json
	npm ci --prefix tools/dockerfile-lint --no-audit --no-fund
	@touch $(DOCKERFILE_LINT)

## image: build the container image (needs a running docker or podman engine)
image:
	@command -v $(CONTAINER_ENGINE) >/dev/null || { echo "make image: $(CONTAINER_ENGINE) is not installed; set CONTAINER_ENGINE=podman or install docker" >&2; exit 1; }
	$(CONTAINER_ENGINE) build -t $(IMAGE) .

# The fuzz targets make test runs, as package directory:target; go test -C
# runs each in its directory, so a nested module's target (testenv) runs in
# its own module, and go test -fuzz takes one target per run. FUZZTIME=1m
# fuzzes longer. The default is a count of executions, not a duration: with
# a duration, Go 1.26's fuzz coordinator can report its own deadline as a
# failure ("context deadline exceeded", no failing input; golang/go#75804,
# fixed in Go 1.27), which failed a fresh clone's make test. A count has no
# deadline to race.
FUZZ_TARGETS := ./index/:FuzzCursor ./index/:FuzzLabelSelector ./index/:FuzzLabelsJSON ./index/:FuzzLabelsUnmarshalJSON \
	./connection/edge/:FuzzDecodeMessage ./testenv/rbacdiff/:FuzzAuthorize
FUZZTIME ?= 50000x

## test-fuzz: each fuzz target for FUZZTIME (their seed corpora also run in every go test)
test-fuzz:
	@set -e; for t in $(FUZZ_TARGETS); do \
		echo "fuzz $${t#*:} for $(FUZZTIME)"; \
		$(GO) test -C "$${t%%:*}" -run '^$$' -fuzz "^$${t#*:}\$$" -fuzztime $(FUZZTIME) .; \
	done

## check-generated: go generate ./... must change no file (gqlgen output is committed)
# It compares the tracked files and the untracked Go files (what gqlgen
# writes) before and after; other untracked files, such as a log that
# `make test > log` is writing in the checkout, are not its business.
GENERATE_INPUTS := { git ls-files -z -c; git ls-files -z -o --exclude-standard -- '*.go'; }
check-generated:
	@mkdir -p $(BIN)
	@$(GENERATE_INPUTS) | xargs -0 sha256sum > $(BIN)/.generate-before 2>&1
	$(GO) generate ./...
	@$(GENERATE_INPUTS) | xargs -0 sha256sum 2>&1 | diff $(BIN)/.generate-before - || \
		{ echo "go generate changed the files above: the generated code was stale (it is regenerated now; commit it)"; exit 1; }

## test-unit: every test that needs no control plane and no Node (the others skip, saying so), with
## fewer random cases than make test runs (the model test, the RBAC differentials), for a quick loop
UNIT_ENV := env -u FLEETGRAPH_TESTENV -u FLEETGRAPH_CONFORMANCE -u FLEETGRAPH_HELM \
	FLEETGRAPH_MODEL_OPS=20000 RBACDIFF_CASES=10000 RBACDIFF_QUERY_PAIRS=1000
test-unit:
	$(UNIT_ENV) $(GO) test -race -timeout 10m ./...
	cd testenv && $(UNIT_ENV) $(GO) test -race -timeout 10m ./...
	cd testenv/rbacdiff/querypath && $(UNIT_ENV) $(GO) test -race -timeout 10m ./...

## lint: golangci-lint v2 with the config in .golangci.yml
lint: $(GOLANGCI_LINT)
	$(GOLANGCI_LINT) run ./...
	cd testenv && $(GOLANGCI_LINT) run --config ../.golangci.yml ./...
	cd testenv/rbacdiff/querypath && $(GOLANGCI_LINT) run --config ../../../.golangci.yml ./...
	cd cmd/fleetbench && $(GOLANGCI_LINT) run --config ../../.golangci.yml ./...

$(GOLANGCI_LINT):
	@mkdir -p $(BIN)
	GOBIN=$(BIN) $(GO) install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION)
	mv $(BIN)/golangci-lint $(GOLANGCI_LINT)

## demo: start seeded local clusters and serve fleetgraph; Ctrl-C stops everything
demo: testenv
	$(GO) build -o $(BIN)/fleetgraph ./cmd/fleetgraph
	$(BIN)/fleetgraph demo

## bench-index: the index at 1M synthetic objects
bench-index:
	cd cmd/fleetbench && $(GO) run . index

## bench-scale: the index at 10M objects (1,000 clusters x 1,000 namespaces x 10); needs about 8 GiB
bench-scale:
	cd cmd/fleetbench && $(GO) run . scale

## test-conformance: the graphql-http server audits and a graphql-ws client against a live server
test-conformance: $(CONFORMANCE_DEPS)
	FLEETGRAPH_CONFORMANCE=1 $(GO) test -race -count=1 -run '^(TestGraphQLOverHTTPAudits|TestGraphQLWSClient)$$' -v ./graph/

## bench-graph: Q3 over HTTP and 1,000 subscribers' fan-out (teams sharing namespaces and fleet-wide
## viewers, about 100 deliveries per change) on the 1M-object fleet; FLEETGRAPH_BENCH_SUBSCRIBERS=10000 for 10,000
bench-graph:
	$(GO) test -run '^$$' -bench '^BenchmarkGraphFleet$$' -benchtime=1x -timeout 30m ./graph/ | grep '^graph:'

## bench-isolation: an ordinary viewer's Q1 and Q3 and ingest on the 1M-object fleet while 4 clients
## send the costliest documents the query limits allow (FLEETGRAPH_BENCH_SMALL=1: 100k objects)
bench-isolation:
	$(GO) test -run '^$$' -bench '^BenchmarkIsolation$$' -benchtime=1x -timeout 30m ./graph/ | grep '^isolation:'

## bench-ui: the dashboard in Chromium on the 1M-object fleet (first render, filter change to
## rendered table), as the admin and as a viewer of 20,000 namespaces; medians of UI_RUNS runs
UI_RUNS ?= 3
bench-ui: $(UI_DEPS) $(CHROMIUM)
	$(GO) run ./ui/e2e/bigfleet -runs $(UI_RUNS)

## bench-authz: access-set build, cached lookup, and Q3 cost for a 4,000-binding user
bench-authz:
	$(GO) test -run '^$$' -bench '^BenchmarkAuthzSummary$$' -benchtime=1x ./authz/ | grep '^authz:'

## test-rbac-full: the RBAC differential tests at 1,000,000 cases (make test runs 50,000) and
## the query-path one at 1,000,000 (policy, viewer) pairs (make test runs 10,000)
test-rbac-full:
	cd testenv && RBACDIFF_CASES=1000000 $(GO) test -count=1 -v -run 'Differential|Cases|Identity' -timeout 30m ./rbacdiff/
	cd testenv/rbacdiff/querypath && RBACDIFF_QUERY_PAIRS=1000000 $(GO) test -count=1 -v -timeout 120m ./...

## bench-collector: first full sync of a real cluster holding 50,000+ objects
bench-collector: testenv
	cd cmd/fleetbench && $(GO) run . collector -v

## bench-fleet: the real collector against 10, 50 and 200 simulated leaf clusters (a load
## generator process serving list/watch over HTTPS) at 1,000 changes/s across the fleet
bench-fleet:
	cd cmd/fleetbench && $(GO) run . fleet -v

## bench-edge: a real `fleetgraph edge` pushing a control plane of 50,000 objects to a real
## `fleetgraph serve`; snapshot apply time, wire bytes per object, delta latency (medians of 3 runs)
bench-edge: testenv
	$(GO) build -o $(BIN)/fleetgraph ./cmd/fleetgraph
	cd cmd/fleetbench && $(GO) run . edge -v -fleetgraph $(BIN)/fleetgraph

## bench-replication: an owner and 2 query replicas (replication.Node, each with its own index and
## NATS connection) over an embedded JetStream server at 1M objects: change lag at 1,000 changes/s,
## a new replica's warm start from the stream, the cold start, stream bytes per object and per change
bench-replication:
	cd cmd/fleetbench && $(GO) run . replication

## bench-compare: fleetgraph beside PostgreSQL (typed columns and JSONB), SQLite and Redis
## at 100k and 1M objects, each size in a fleetbench process of its own; writes BENCHMARKS.md and
## docs/bench-compare.png. The servers are started and stopped by fleetbench itself (temporary
## directories, loopback ports).
bench-compare: bench-servers
	cd cmd/fleetbench && $(GO) run . compare -v -report ../../BENCHMARKS.md -chart ../../docs/bench-compare.png

# Debian's postgresql and redis-server, installed once. POLICYRCD stops the
# packages from starting their system services: fleetbench runs its own.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
bench-servers:
	@if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || ! command -v redis-server >/dev/null; then \
		mkdir -p $(BIN) && printf '#!/bin/sh\nexit 101\n' > $(BIN)/policy-rc.d && chmod +x $(BIN)/policy-rc.d && \
		$(SUDO) apt-get update && \
		$(SUDO) env POLICYRCD=$(BIN)/policy-rc.d DEBIAN_FRONTEND=noninteractive apt-get install -y postgresql redis-server; \
	fi

## crds: refresh the Istio CRDs fixture from the istio.io/api module
crds:
	cp "$$($(GO) list -m -f '{{.Dir}}' istio.io/api)/kubernetes/customresourcedefinitions.gen.yaml" internal/testcluster/testdata/istio-crds.yaml
	chmod 644 internal/testcluster/testdata/istio-crds.yaml

$(CONFORMANCE_DEPS): graph/conformance/package-lock.json
	npm ci --prefix graph/conformance --no-audit --no-fund

clean:
	rm -rf $(BIN)
