# meshagent: `make run` runs the agent, `make test` runs the tests.
GO        ?= go
BIN       := bin
RUN_ROOT  := $(CURDIR)/.tmp/run
GOFILES    = $(shell git ls-files '*.go' | grep -v '\.pb\.go$$')
# Packages under testdata with tests of their own: ./... skips testdata.
TESTDATA  := ./testdata/standalone ./testdata/testkit/...
# The agent's version (`meshagent version`, the bootstrap's ISTIO_VERSION):
# the nearest tag, else the commit, "-dirty" with uncommitted changes.
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo unknown)
LDFLAGS   := -X main.buildVersion=$(VERSION) -X main.buildRevision=$(shell git rev-parse HEAD 2>/dev/null)

.PHONY: all build fakeenvoy run test test-short lint bench bench-tree bench-capture bench-envoy bench-restart bench-identity bench-dns bench-rss golden chaos clean

all: build

# Static, as Istio builds its agent (common/scripts/gobuild.sh): no libc
# mapped in (~2 MiB of RSS); net and os/user use their pure-Go versions.
build:
	CGO_ENABLED=0 $(GO) build -ldflags '$(LDFLAGS)' -o $(BIN)/meshagent ./cmd/meshagent

fakeenvoy:
	$(GO) build -o $(BIN)/fakeenvoy ./testdata/fakeenvoy

# The Envoy `make run` starts: a real envoy if one is on PATH, else the
# stand-in from testdata/fakeenvoy.
ENVOY     ?= $(shell command -v envoy 2>/dev/null || echo $(CURDIR)/$(BIN)/fakeenvoy)

# Runs the whole agent in the foreground with every file under .tmp/run (no
# root needed): dev certificates (file-mounted), SDS, Envoy, status.
run: build fakeenvoy
	@mkdir -p $(RUN_ROOT)
	@$(GO) run ./testdata/devcerts -out $(RUN_ROOT)/etc/certs
	@echo "meshagent: files under $(RUN_ROOT), Envoy: $(ENVOY)"
	@echo "  curl localhost:15020/debug/tree     the supervision tree"
	@echo "  curl -i localhost:15020/healthz/ready"
	@echo "  dig @127.0.0.1 -p 15053 reviews +short      the DNS proxy (names: testdata/nametable/demo.json)"
	@echo "  curl -XPOST 'localhost:15020/debug/chaos/kill?service=envoy'   watch it heal; Ctrl-C drains and stops"
	PROXY_CONFIG='{"binaryPath":"$(ENVOY)","terminationDrainDuration":"2s"}' \
	POD_NAME=demo-0 POD_NAMESPACE=default INSTANCE_IP=127.0.0.1 SERVICE_ACCOUNT=default \
	MESHAGENT_CHAOS=1 $(BIN)/meshagent proxy --root $(RUN_ROOT) --name-table $(CURDIR)/testdata/nametable/demo.json

# The whole suite with the race detector. Tests that need root or network
# namespaces run when they can and skip with a reason otherwise.
test: lint
	$(GO) test -race -count=1 -timeout 12m ./... $(TESTDATA)

test-short:
	$(GO) test -short -count=1 ./... $(TESTDATA)

lint:
	$(GO) vet ./... $(TESTDATA)
	@out=$$(gofmt -l $(GOFILES)); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

# Every benchmark, each printed beside its baseline from the same run.
bench: bench-tree bench-capture bench-envoy bench-identity bench-dns bench-rss

bench-tree:
	$(GO) test -run '^$$' -bench . -benchtime 20000x ./messages
	$(GO) test -run '^$$' -bench 'Restart(ThroughRunner|BareSuture)' -benchtime 20000x ./tree
	$(GO) test -run '^$$' -bench 'AgentExec|ExecEnvoyDirect' -benchtime 20x ./cmd/meshagent

bench-capture:
	$(GO) test -run '^$$' -bench ApplySidecarRules -benchtime 30x ./services/capture

bench-envoy: bench-restart
	$(GO) test -run '^$$' -bench . -benchtime 200x ./services/envoy

# SIGKILL → next Envoy running through the tree, p50 and max over 20 kills,
# beside a bare os/exec restart.
bench-restart:
	$(GO) test -run '^$$' -bench 'KillToNextRunning' -benchtime 20x ./tree

bench-identity:
	$(GO) test -run '^$$' -bench . -benchtime 100x ./tree/identitye2e ./services/certs

bench-dns:
	$(GO) test -run '^$$' -bench . -benchmem ./services/dnsproxy
	ROUNDS=$${ROUNDS:-3} bash bench/dns/run.sh

# The whole agent's RSS idle and under DNS load, beside Istio's pilot-agent
# measured the same way in the same run (root: dnsmasq on a loopback :53).
bench-rss:
	bash bench/agent/rss.sh

golden:
	$(GO) test ./services/envoy -run Golden -update

chaos:
	MESHAGENT_CHAOS_LONG=1 $(GO) test -race -count=1 -timeout 30m -run Chaos ./...

clean:
	rm -rf $(BIN) .tmp
