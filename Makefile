# meshagent: `make run` runs the agent, `make test` runs the tests.
GO        ?= go
BIN       := bin
RUN_ROOT  := $(CURDIR)/.tmp/run
GOFILES    = $(shell git ls-files '*.go' | grep -v '\.pb\.go$$')

.PHONY: all build fakeenvoy run test test-short lint bench chaos clean

all: build

build:
	$(GO) build -o $(BIN)/meshagent ./cmd/meshagent

fakeenvoy:
	$(GO) build -o $(BIN)/fakeenvoy ./testdata/fakeenvoy

# Runs the agent in the foreground with every file under .tmp/run (no root
# needed). Status: http://localhost:15020/debug/tree and /healthz/ready.
run: build
	@mkdir -p $(RUN_ROOT)
	@echo "meshagent: files under $(RUN_ROOT); try: curl localhost:15020/debug/tree ; Ctrl-C to stop"
	MESHAGENT_CHAOS=1 $(BIN)/meshagent proxy --root $(RUN_ROOT)

# The whole suite with the race detector. Tests that need root or network
# namespaces run when they can and skip with a reason otherwise.
test: lint
	$(GO) test -race -count=1 -timeout 12m ./...

test-short:
	$(GO) test -short -count=1 ./...

lint:
	$(GO) vet ./...
	@out=$$(gofmt -l $(GOFILES)); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

bench:
	$(GO) test -run '^$$' -bench . -benchtime 1x -count 1 ./tree/...
	$(GO) test -run '^$$' -bench . -count 1 ./messages/...

chaos:
	MESHAGENT_CHAOS_LONG=1 $(GO) test -race -count=1 -timeout 30m -run Chaos ./...

clean:
	rm -rf $(BIN) .tmp
