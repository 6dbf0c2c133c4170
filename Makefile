# jetorder: ordering keys on NATS JetStream.
GO ?= go

.PHONY: run test browser emulator prometheus node-deps bench soak fuzz build

## run: start the sidecar with its embedded NATS server (data in ./data)
run:
	$(GO) run ./cmd/sidecar --data-dir ./data --nats-listen 127.0.0.1:4222

## test: vet and run every test with the race detector; the delivery tests run twice, the second time with per-key delivery, and the features and faults twice more on topics with key streams
# The integration tests are several packages (integration, its power cuts,
# its multi-process cluster, access control, Google's clients' own tests)
# so that go test runs them side by side; the second pass takes those
# whose subscriptions deliver. The third and fourth run the tests of the
# features and faults with every topic they create split over 4 key
# streams, partitioned then per-key (the TestKeyStreams tests choose their
# topics' layouts and delivery modes themselves: the first two passes run
# them).
DELIVERY_PKGS := ./integration ./integration/powercut ./integration/cluster
KEY_STREAM_TESTS := TestFault|TestExactlyOnce|TestParity|TestDIDComm|TestSidecarDIDComm|TestPipelined|TestPush|TestSidecarSeek|TestSeek|TestScaleOut|TestSidecarDeadLetter|TestClusterChaos
test: browser emulator prometheus node-deps
	$(GO) vet ./...
	$(GO) test -race -timeout 20m ./...
	# -count=1: the test cache does not see the variables (read at package init)
	JETORDER_TEST_DELIVERY=per-key $(GO) test -race -count=1 -timeout 20m $(DELIVERY_PKGS)
	JETORDER_TEST_KEY_STREAMS=4 $(GO) test -race -count=1 -timeout 20m -run '$(KEY_STREAM_TESTS)' ./integration ./integration/cluster
	JETORDER_TEST_KEY_STREAMS=4 JETORDER_TEST_DELIVERY=per-key $(GO) test -race -count=1 -timeout 20m -run '$(KEY_STREAM_TESTS)' ./integration ./integration/cluster

## browser: a Chromium for the status page's browser test; .ci/chromium installs Debian's chromium when none is found (as root)
browser:
	bash .ci/chromium

## emulator: Google's Pub/Sub emulator for the parity tests; .ci/pubsub-emulator installs Debian's google-cloud-cli-pubsub-emulator when none is found (as root)
emulator:
	bash .ci/pubsub-emulator

## prometheus: Prometheus and promtool for the tests of the alerting rules (deploy/prometheus, integration/alerting); .ci/prometheus installs Debian's prometheus when missing (as root), leaving its service stopped
prometheus:
	bash .ci/prometheus

## node-deps: Google's Node.js client for integration/access's Node test (npm ci in integration/access/node, again when its lock file changes)
# Without npm the test is skipped, unless JETORDER_REQUIRE_NODE=1 (CI), where
# this fails.
NODE_DIR := integration/access/node
node-deps: $(NODE_DIR)/node_modules/.package-lock.json
$(NODE_DIR)/node_modules/.package-lock.json: $(NODE_DIR)/package.json $(NODE_DIR)/package-lock.json
	@if command -v npm >/dev/null 2>&1; then \
		echo "cd $(NODE_DIR) && npm ci --no-audit --no-fund --ignore-scripts"; \
		cd $(NODE_DIR) && npm ci --no-audit --no-fund --ignore-scripts && touch node_modules/.package-lock.json; \
	elif [ "$${JETORDER_REQUIRE_NODE:-}" = 1 ]; then \
		echo "node-deps: npm not found; JETORDER_REQUIRE_NODE=1 wants the Node client's test to run (install Node.js and npm)" >&2; exit 1; \
	else \
		echo "node-deps: npm not found; the Node client's test will be skipped (install Node.js and npm)" >&2; \
	fi

## bench: throughput, latency and memory against raw JetStream baselines; charts of them into docs/bench
# Flags through BENCHFLAGS, e.g. make bench BENCHFLAGS='-runs ordered -rounds 1'.
# CPU profiles of the deliveries whose targets are hardest (1,000 keys
# partitioned; 256 keys pipelined through the Go client) go to BENCHPROFILES,
# and the bench prints where their CPU went.
BENCHFLAGS ?=
BENCHPROFILES ?= $(or $(TMPDIR),/tmp)/jetorder-bench-profiles
bench:
	mkdir -p $(BENCHPROFILES)
	$(GO) run ./bench -charts docs/bench -modes-cpuprofile $(BENCHPROFILES)/modes-1000-keys.prof -modes-key-streams-cpuprofile $(BENCHPROFILES)/modes-1000-keys-key-streams.prof -pipe-cpuprofile $(BENCHPROFILES)/pipelined-256-keys.prof $(BENCHFLAGS)

## soak: 3 minutes of ordered publish and receive with key churn (not in CI); fails if goroutines, heap, RSS or consumers keep growing
# Flags through SOAKFLAGS, e.g. make soak SOAKFLAGS='-duration 45s -mode library'
SOAKFLAGS ?=
soak:
	$(GO) run ./soak $(SOAKFLAGS)

## fuzz: run each fuzz target for FUZZTIME (a count, e.g. 500000x, or a duration)
# A count by default: with a duration, Go 1.26's fuzz coordinator can report
# "context deadline exceeded" at the deadline without any failing input
# (golang/go#75804, fixed in Go 1.27).
FUZZTIME ?= 500000x
fuzz:
	$(GO) test ./keyrouter -run '^$$' -fuzz FuzzKeyToken -fuzztime $(FUZZTIME)
	$(GO) test ./didcomm -run '^$$' -fuzz FuzzReadPlaintext -fuzztime $(FUZZTIME)
	$(GO) test ./didcomm -run '^$$' -fuzz FuzzReadHeader -fuzztime $(FUZZTIME)
	$(GO) test ./internal/pubsubapi -run '^$$' -fuzz FuzzParseAckID -fuzztime $(FUZZTIME)
	$(GO) test ./internal/httpapi -run '^$$' -fuzz FuzzReadEvent -fuzztime $(FUZZTIME)
	$(GO) test ./internal/httpapi -run '^$$' -fuzz FuzzDecodeJSON -fuzztime $(FUZZTIME)
	$(GO) test ./adapter -run '^$$' -fuzz FuzzReadMetadata -fuzztime $(FUZZTIME)
	$(GO) test ./cloudevents -run '^$$' -fuzz FuzzDecode -fuzztime $(FUZZTIME)
	$(GO) test ./internal/filter -run '^$$' -fuzz FuzzParse -fuzztime $(FUZZTIME)

## build: the sidecar as a static binary, bin/sidecar
# Go records the commit itself in a git clone; COMMIT is for the builds where
# it cannot (a git worktree, GOFLAGS=-buildvcs=false), shown by --version.
COMMIT ?= $(shell c=$$(git rev-parse HEAD 2>/dev/null) && { test -z "$$(git status --porcelain 2>/dev/null)" || c=$$c-modified; echo $$c; })
build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '-X main.commit=$(COMMIT)' -o bin/ ./cmd/...
