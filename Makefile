# meshagent: `make run` runs the agent, `make test` runs the tests.
GO        ?= go
BIN       := bin
RUN_ROOT  := $(CURDIR)/.tmp/run
GOFILES    = $(shell git ls-files '*.go' | grep -v '\.pb\.go$$')
# Packages under testdata with tests of their own: ./... skips testdata.
TESTDATA  := ./testdata/standalone ./testdata/testkit/... ./testdata/fakeenvoy
# The agent's version (`meshagent version`, the bootstrap's ISTIO_VERSION):
# the nearest tag, else the commit, "-dirty" with uncommitted changes.
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo unknown)
LDFLAGS   := -X main.buildVersion=$(VERSION) -X main.buildRevision=$(shell git rev-parse HEAD 2>/dev/null)

.PHONY: all build fakeenvoy run test test-short fuzz attack lint bench bench-tree bench-capture bench-envoy bench-restart bench-identity bench-dns bench-rss bench-xds bench-status bench-vs-istio bench-kube-storm golden conformance conformance-update peer-istio-agent chaos soak clean

all: build

# Static, as Istio builds its agent (common/scripts/gobuild.sh): no libc
# mapped in (~2 MiB of RSS); net and os/user use their pure-Go versions.
# Stripped and with trimmed paths, as Istio's release build
# (RELEASE_LDFLAGS, -trimpath): 51.7 → 35.5 MB (#36; every pod's image and
# page cache pays for the file). Stack traces keep their function names and
# lines (the pclntab is not stripped); a debugger needs an unstripped build
# (`make build STRIP=`).
# meshagent-init is the small init the agent hands PID 1 to in a container
# (cmd/meshagent/reaper.go); it is found beside the agent.
STRIP     ?= -s -w
# grpcnotrace: gRPC-Go's own switch that leaves out golang.org/x/net/trace,
# whose only use is the /debug/requests and /debug/events pages it registers
# on http.DefaultServeMux, which the agent never serves, and gRPC's tracing
# (grpc.EnableTracing), which it never turns on: 0.12 MB of the binary (#36).
# disable_pgv: go-control-plane's switch that leaves out the generated
# Validate methods of Envoy's API types: 6.6 MB, kept whole because
# text/template (user bootstrap templates) looks methods up by name, which
# makes the linker keep every exported method. The agent used them for one
# check, a user template's rendered bootstrap, which Envoy makes anyway
# when it loads it (services/envoy/bootstrap/rules_off.go); go test keeps
# them, and checks every bootstrap the agent writes against them.
AGENT_TAGS := grpcnotrace disable_pgv
build:
	CGO_ENABLED=0 $(GO) build -tags '$(AGENT_TAGS)' -trimpath -ldflags '$(STRIP) $(LDFLAGS)' -o $(BIN)/meshagent ./cmd/meshagent
	CGO_ENABLED=0 $(GO) build -ldflags '-s -w' -o $(BIN)/meshagent-init ./cmd/meshagent-init

fakeenvoy:
	$(GO) build -o $(BIN)/fakeenvoy ./testdata/fakeenvoy

# The sidecar image of our tests, in the layout of Istio's proxyv2 (#20),
# built without a container daemon the way users build theirs on Istio's
# own proxyv2 (#32): hack/mkimage lays out a proxyv2-shaped base (the
# stand-in Envoy, Istio's bootstrap template, iptables, uid 1337, a
# placeholder where Istio's agent goes), then `meshagent image` layers the
# agent and its init onto it, as onto Istio's image. The docker-archive's
# path is the last line printed; load it on a node with
#   ctr -n k8s.io images import bin/meshagent-proxyv2-image.tar
# Envoy in it is the stand-in (testdata/fakeenvoy, static): it relays
# captured TCP but is no Envoy, and the image's labels and the agent's first
# log line say so.
# `make image-istio` builds the same layout with Istio's own pilot-agent (the
# oracle of the kube suite); it is a valid base for `meshagent image` too.
# iptables and the libraries come from this host (apt-get install
# iptables). Istio's bootstrap template comes from the Istio source the
# conformance suite reads (Go's module cache).
IMAGE_TAG        ?= localhost/meshagent-proxyv2:dev
IMAGE_TAR        ?= $(BIN)/meshagent-proxyv2-image.tar
STANDIN_BASE_TAR ?= $(BIN)/standin-proxyv2-base.tar
ISTIO_IMAGE_TAG  ?= localhost/istio-proxyv2:oracle
ISTIO_IMAGE_TAR  ?= $(BIN)/istio-proxyv2-image.tar
ISTIO_MODULE     := $(shell sed -n 's/^const IstioSourceVersion = "\(.*\)"$$/\1/p' cmd/meshagent/internal/e2ekit/istio.go)
ISTIO_SRC        ?= $(shell $(GO) env GOMODCACHE)/$(ISTIO_MODULE)
ISTIO_TEMPLATE   := $(ISTIO_SRC)/tools/packaging/common/envoy_bootstrap.json
STAND_IN_LABEL   := io.meshagent.envoy=stand-in (testdata/fakeenvoy): no real Envoy; relays captured TCP to its original destination, no TLS, routing or load balancing
IMAGE_FLAGS       = -envoy $(BIN)/fakeenvoy-static -bootstrap-template $(ISTIO_TEMPLATE) \
	-label '$(STAND_IN_LABEL)' -label 'io.istio.version=1.31 pre-release ($(ISTIO_MODULE))' \
	-env 'ISTIO_META_ISTIO_PROXY_SHA=fakeenvoy-$(VERSION)'

.PHONY: image image-base image-istio fakeenvoy-static istio-template
image: build image-base
	$(BIN)/meshagent image --base $(STANDIN_BASE_TAR) -o $(IMAGE_TAR) --tag $(IMAGE_TAG) \
	  --label org.opencontainers.image.version=$(VERSION) --label org.opencontainers.image.revision=$(shell git rev-parse HEAD 2>/dev/null)
	@echo $(abspath $(IMAGE_TAR))

image-base: fakeenvoy-static istio-template
	$(GO) run ./hack/mkimage -placeholder-agent $(IMAGE_FLAGS) -tag localhost/standin-proxyv2:base -o $(STANDIN_BASE_TAR)

image-istio: peer-istio-agent fakeenvoy-static istio-template
	$(GO) run ./hack/mkimage -agent $(ISTIO_AGENT) $(IMAGE_FLAGS) -tag $(ISTIO_IMAGE_TAG) -o $(ISTIO_IMAGE_TAR) \
	  -label 'io.meshagent.agent=istio pilot-agent (../shared/peers/istio-agent), the oracle' \
	  -label org.opencontainers.image.revision=$(shell git rev-parse HEAD 2>/dev/null)

# The agent and its init for another platform (CGO_ENABLED=0, as `make
# build`), for `meshagent image --agent linux/arm64=bin/linux-arm64/meshagent`
# on a multi-platform base; the init is found beside the agent.
.PHONY: build-linux-arm64 build-linux-amd64
build-linux-arm64 build-linux-amd64: build-linux-%:
	CGO_ENABLED=0 GOOS=linux GOARCH=$* $(GO) build -tags '$(AGENT_TAGS)' -trimpath -ldflags '$(STRIP) $(LDFLAGS)' -o $(BIN)/linux-$*/meshagent ./cmd/meshagent
	CGO_ENABLED=0 GOOS=linux GOARCH=$* $(GO) build -ldflags '-s -w' -o $(BIN)/linux-$*/meshagent-init ./cmd/meshagent-init

# Static, as `make build` builds the agent: it loads none of the image's
# libraries (those are there for iptables and a dynamic Istio agent).
fakeenvoy-static:
	CGO_ENABLED=0 $(GO) build -o $(BIN)/fakeenvoy-static ./testdata/fakeenvoy

istio-template:
	@test -n "$(ISTIO_MODULE)" || { echo "no IstioSourceVersion in cmd/meshagent/internal/e2ekit/istio.go"; exit 1; }
	@test -f $(ISTIO_TEMPLATE) || $(GO) mod download $(ISTIO_MODULE)

# Runs `meshagent standalone` in the foreground with every file under
# .tmp/run (no root needed): the agent's whole tree plus an embedded control
# plane serving RUN_MESH and an embedded CA signing the agent's certificate.
# Envoy: a real one if installed, else the stand-in built here (the agent
# looks for it beside itself and says which in its log). Dev certificates
# an older `make run` wrote under .tmp/run would bypass the CA: removed.
RUN_MESH  := testdata/standalone/mesh.yaml
run: build fakeenvoy
	@mkdir -p $(RUN_ROOT)
	@rm -rf $(RUN_ROOT)/etc/certs
	@echo "meshagent standalone: the agent + a control plane (127.0.0.1:16010) serving $(RUN_MESH)"
	@echo "  + a CA (127.0.0.1:16012) signing 1-minute certificates; files under $(RUN_ROOT). In another terminal:"
	@echo "  curl -i localhost:15020/healthz/ready                   ready once Envoy has the mesh and a certificate"
	@echo "  curl localhost:15020/debug/tree                         the tree: peers (controlplane, ca), identity, xds, envoy, status"
	@echo "  curl -s localhost:15020/stats/prometheus | grep -E '^istio_agent_(ca|cert|controlplane)_'   certificates issued, expiry, mesh loads"
	@echo "  dig @127.0.0.1 -p 15053 reviews.default.svc.cluster.local +short   10.96.0.10, from the mesh (NDS)"
	@echo "  dig @127.0.0.1 -p 15053 api.example.com +short          240.240.0.10; other names go to your resolver"
	@echo "  curl -s localhost:15000/config_dump | grep -o 'outbound|[^\"]*' | sort -u   what Envoy holds"
	@echo "  curl -XPOST 'localhost:15020/debug/chaos/kill?service=controlplane'   make a service fail, watch it heal"
	@echo "Edit $(RUN_MESH) (add a service): config_dump and dig follow within a second. Ctrl-C drains and stops."
	$(BIN)/meshagent standalone --root $(RUN_ROOT) --mesh $(RUN_MESH) --chaos

# The whole suite with the race detector, alone on a fresh Debian machine
# (#32): as root it installs the Debian packages the tests use (`make
# deps`) and builds every missing peer into the cache (`make peers`), then
# runs the suite. As another user it installs nothing and builds only the
# peers that need no root; tests that need root or network namespaces skip
# with a reason. What was skipped, and why, is printed last.
test: deps peers lint
	@mkdir -p .tmp && rm -f .tmp/e2e-summary.txt
	@# The end-to-end suites against Istio's istiod and the kube node say
	@# last whether they ran, or why they skipped (#20).
	MESHAGENT_E2E_SUMMARY=$(CURDIR)/.tmp/e2e-summary.txt $(GO) test -race -count=1 -timeout 12m ./... $(TESTDATA); \
	  rc=$$?; cat $(PREREQ_SUMMARY) .tmp/e2e-summary.txt 2>/dev/null; exit $$rc
	@# Every benchmark once, so that none rots unnoticed (two had: their
	@# Envoy never turned ready once readiness followed Istio's).
	$(GO) test -count=1 -run '^$$' -bench . -benchtime 1x ./... $(TESTDATA)

# Tests that wait minutes (MESHAGENT_SOAK=1): a control-plane stream kept
# across the agents' keepalive pings.
soak:
	MESHAGENT_SOAK=1 $(GO) test -count=1 -run 'Soak' ./... $(TESTDATA)

test-short:
	$(GO) test -short -count=1 ./... $(TESTDATA)

# Every fuzz target of the module (each Fuzz* function, found by
# hack/fuzz.sh), FUZZTIME each; fails on any crash. Their seeds already run
# as ordinary tests in `make test`.
FUZZTIME ?= 30s
fuzz:
	FUZZTIME=$(FUZZTIME) GO=$(GO) bash hack/fuzz.sh ./... $(TESTDATA)

# The attack classes of issue #33 against a built agent in a network
# namespace and a memory cgroup (root); prints each attack's peak beside its
# bound, fails if the agent dies or passes one (hack/attack.sh).
attack:
	bash hack/attack.sh

lint:
	$(GO) vet ./... $(TESTDATA)
	@out=$$(gofmt -l $(GOFILES)); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

# The product against Istio's agent (#24): bin/meshagent as users run it
# (`proxy sidecar`) and Istio's pilot-agent, interleaved in one run, one
# table: start → ready, memory as Kubernetes counts it (each agent in a
# cgroup of its own: working set, anon, RSS; beside them the floor, a Go
# program doing only the idle job, #36), xDS pushes through the whole
# agent and the GC settings (root: cgroups; ~15 minutes).
bench-vs-istio: build peer-istio-agent
	bash bench/vs-istio/run.sh

# The start and reconnect storms on the kube node (#36): STORM_PODS pods
# (default 30) created at once, once with each agent, then istiod restarted
# under them; STORM_ROUNDS rounds (default 2), the order turned each round,
# a table per round (bench/kube-storm/run.sh). Root; the kube peers built
# (`make peers-kube`).
bench-kube-storm:
	bash bench/kube-storm/run.sh

# The part benchmarks, for profiling: each part printed beside its
# baseline from the same run. `make bench-vs-istio` measures the product.
bench: bench-tree bench-capture bench-envoy bench-identity bench-dns bench-rss bench-xds bench-status

bench-tree:
	$(GO) test -run '^$$' -bench . -benchtime 20000x ./messages
	$(GO) test -run '^$$' -bench 'Restart(ThroughRunner|BareSuture)' -benchtime 20000x ./tree
	$(GO) test -run '^$$' -bench 'AgentExec|ExecEnvoyDirect' -benchtime 20x ./cmd/meshagent/e2e

bench-capture:
	$(GO) test -run '^$$' -bench ApplySidecarRules -benchtime 30x ./services/capture

bench-envoy: bench-restart
	$(GO) test -run '^$$' -bench . -benchtime 200x ./services/envoy/...

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

# Envoy ⇄ agent ⇄ control plane: a CDS push and a small update through the
# proxy beside a direct connection, then the same load through Istio's
# pilot-agent in the same script (bench/xds/RESULTS.md).
bench-xds:
	$(GO) test -run '^$$' -bench . -benchtime 15x ./services/xdsproxy
	ROUNDS=$${ROUNDS:-31} bash bench/xds/run.sh

# A merged /stats/prometheus scrape (5000 Envoy + 1000 application series)
# beside Istio's own merge code run on the same bodies.
bench-status:
	$(GO) test -run '^$$' -bench Scrape -benchmem ./services/status

# The peers (../shared/peers beside the checkout, or one level up for a
# worktree), built once per machine into PEER_CACHE, never into the repo:
# each skipped when cached. PREREQ_SUMMARY gathers what `make test` skipped.
PEERS          ?= $(firstword $(wildcard $(abspath $(CURDIR)/../shared/peers $(CURDIR)/../../shared/peers)) $(abspath $(CURDIR)/../shared/peers))
PEER_CACHE     ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/meshagent-peers
PREREQ_SUMMARY := .tmp/prereq-summary.txt
ROOT           := $(shell [ "$$(id -u)" = 0 ] && echo yes)
# build-peer NAME, COMMAND: runs it, timed, so that a log shows where a cold
# machine's time goes.
build-peer = start=$$(date +%s); echo "building peer: $(1)"; $(2) && echo "peer $(1) built in $$(( $$(date +%s) - start )) s"

.PHONY: deps peers peer-istiod peer-kube
# The Debian packages the tests use (hack/install-deps.sh; as root only).
deps:
	@mkdir -p .tmp && rm -f $(PREREQ_SUMMARY)
	@bash hack/install-deps.sh $(PREREQ_SUMMARY)

peers: peer-istio-agent peer-istiod peer-kube

# Istio's own pilot-agent, the oracle of the conformance suite and the
# baseline of the benchmarks (Go only: built as any user).
ISTIO_AGENT  ?= $(PEER_CACHE)/pilot-agent
peer-istio-agent: deps
	@test -x $(ISTIO_AGENT) || { test -d $(PEERS)/istio-agent || { echo "no $(PEERS): clone meshagent's shared/ beside the checkout" >&2; exit 1; }; \
	  $(call build-peer,istio-agent,bash $(PEERS)/istio-agent/build.sh $(ISTIO_AGENT)); }

# Istio's istiod (../shared/peers/istiod): its suite needs root (a network
# namespace), so another user skips the 4-6 minute build.
ISTIOD_PEER ?= $(PEER_CACHE)/istiod
peer-istiod: deps
	@if [ -x $(ISTIOD_PEER)/istiod-local ] && [ -x $(ISTIOD_PEER)/jwtlocal ]; then :; \
	elif [ "$(ROOT)" != yes ]; then mkdir -p .tmp; echo "skipped: building the istiod peer (its suite, TestIstiodEndToEnd, needs root)" | tee -a $(PREREQ_SUMMARY); \
	else $(call build-peer,istiod,sh $(PEERS)/istiod/build.sh $(ISTIOD_PEER)); fi

# The kube node and Istio on it (../shared/peers/kube, hack/kube/build-istio.sh;
# each binary skipped when cached): root only, as the node is.
KUBE_BUILT = . hack/kube/common.sh && for f in $$KUBE_BIN/kube-apiserver $$KUBE_BIN/kubelet $$KUBE_BIN/kubectl \
	  $$KUBE_BIN/kube-scheduler $$KUBE_BIN/kube-controller-manager $$KUBE_IMAGES/images.tar \
	  $$ISTIO_KUBE_BIN/pilot-discovery $$ISTIO_KUBE_BIN/istioctl $$ISTIO_KUBE_BIN/kube-proxy $$ISTIO_KUBE_BIN/coredns; do [ -e $$f ] || exit 1; done
peer-kube: deps
	@if [ "$(ROOT)" != yes ]; then mkdir -p .tmp; echo "skipped: building the kube node and Istio on it (the kube suite needs root)" | tee -a $(PREREQ_SUMMARY); \
	elif PEERS=$(PEERS) bash -c '$(KUBE_BUILT)' 2>/dev/null; then :; \
	else mkdir -p .tmp; $(call build-peer,kube,PEERS=$(PEERS) bash hack/kube/build-istio.sh kube >.tmp/peer-kube.log 2>&1 || { tail -20 .tmp/peer-kube.log; exit 1; }); fi

# The differential suite: every case run by Istio's agent and by ours with a
# stand-in Envoy that records what it was given, compared field by field;
# `make test` replays the checked-in goldens without Istio.
conformance: peer-istio-agent
	@mkdir -p .tmp
	@MESHAGENT_ISTIO_AGENT=$(ISTIO_AGENT) MESHAGENT_CONFORMANCE=1 $(GO) test -count=1 -run 'Conformance' -v ./cmd/meshagent ./cmd/meshagent/conformance >.tmp/conformance.log 2>&1; \
	  rc=$$?; grep -E '^(conformance:|--- FAIL|FAIL|ok)' .tmp/conformance.log; [ $$rc -eq 0 ] || { echo "details: .tmp/conformance.log"; exit $$rc; }
	@MESHAGENT_ISTIO_AGENT=$(ISTIO_AGENT) $(GO) test -count=1 -run 'Differential' -v ./services/status >.tmp/differential.log 2>&1; \
	  rc=$$?; grep -E '^(--- |FAIL|ok)' .tmp/differential.log; [ $$rc -eq 0 ] || { echo "details: .tmp/differential.log"; exit $$rc; }

# Rewrites cmd/meshagent/conformance/testdata from Istio's agent.
conformance-update: peer-istio-agent
	MESHAGENT_ISTIO_AGENT=$(ISTIO_AGENT) MESHAGENT_CONFORMANCE=update $(GO) test -count=1 -run 'Conformance' ./cmd/meshagent/conformance

golden:
	$(GO) test ./services/envoy/... -run Golden -update

# The chaos suites, long form: TestStandaloneChaos (CHAOS_ROUNDS rounds of
# every fault kind on `meshagent standalone`; MESHAGENT_CHAOS_SEED replays a
# run), TestAgentChaos on `proxy` and the tree's soak. Its summary line is
# printed last (and kept in .tmp/chaos-summary.txt).
CHAOS_ROUNDS ?= 300
chaos:
	@mkdir -p .tmp
	MESHAGENT_CHAOS_LONG=1 MESHAGENT_CHAOS_ROUNDS=$(CHAOS_ROUNDS) MESHAGENT_CHAOS_SUMMARY=$(CURDIR)/.tmp/chaos-summary.txt \
	  $(GO) test -race -count=1 -timeout 60m -run Chaos ./...
	@cat .tmp/chaos-summary.txt

clean:
	rm -rf $(BIN) .tmp

# meshagent against Istio's own istiod (../shared/peers/istiod, built once
# into the cache, never into the repo), beside Istio's pilot-agent on the
# same istiod: the whole chain, a ServiceEntry change, an istiod restart,
# the differential and the figures. Root (a network namespace of its own).
# `make test` runs it only when both are already built.
.PHONY: e2e-istiod
e2e-istiod: peer-istio-agent peer-istiod
	@mkdir -p .tmp
	@MESHAGENT_ISTIOD_DIR=$(ISTIOD_PEER) MESHAGENT_ISTIOD_RUN=$(PEERS)/istiod/run MESHAGENT_ISTIO_AGENT=$(ISTIO_AGENT) \
	  $(GO) test -count=1 -run '^TestIstiodEndToEnd$$' -v ./cmd/meshagent/e2e >.tmp/e2e-istiod.log 2>&1; \
	  rc=$$?; grep -E 'figure |differential:|no differential|--- (FAIL|SKIP)|^(FAIL|ok)' .tmp/e2e-istiod.log | sed 's/^.*istiod_test.go:[0-9]*: //'; \
	  [ $$rc -eq 0 ] || { echo "details: .tmp/e2e-istiod.log"; exit $$rc; }

# Installs meshagent for a VM or bare-metal host, as Istio's VM package
# installs pilot-agent and istio.service (docs/capabilities.md, "VM / bare metal"):
# the binary, the systemd unit (ExecStart pointing at the binary installed)
# and the directories the onboarding bundle's files go to. DESTDIR stages
# the install (packaging); run `systemctl daemon-reload` after a real one.
PREFIX  ?= /usr/local
UNITDIR ?= /etc/systemd/system
install-vm: build
	install -D -m 0755 $(BIN)/meshagent $(DESTDIR)$(PREFIX)/bin/meshagent
	@mkdir -p .tmp
	sed 's|/usr/local/bin/meshagent|$(PREFIX)/bin/meshagent|g' cmd/meshagent/meshagent.service >.tmp/meshagent.service
	install -D -m 0644 .tmp/meshagent.service $(DESTDIR)$(UNITDIR)/meshagent.service
	install -d -m 0755 $(DESTDIR)/var/lib/istio/envoy $(DESTDIR)/etc/istio/config $(DESTDIR)/etc/certs
	@echo "installed $(DESTDIR)$(PREFIX)/bin/meshagent and $(DESTDIR)$(UNITDIR)/meshagent.service; next (docs/capabilities.md, \"VM / bare metal\"):"
	@echo "  cluster.env -> /var/lib/istio/envoy/cluster.env, mesh.yaml -> /etc/istio/config/mesh,"
	@echo "  root-cert.pem -> /etc/certs/root-cert.pem, istio-token -> /var/run/secrets/tokens/istio-token, an Envoy at /usr/local/bin/envoy;"
	@echo "  systemctl daemon-reload && systemctl enable --now meshagent"
.PHONY: install-vm

# Istio on a real single-node Kubernetes (#20): the kube peer
# (../shared/peers/kube) brought up, Istio's istiod on it with its manifests
# rendered by istioctl, and pods injected by Istio's webhook, once with our
# image (`make image`) and once with Istio's agent in it (`make image-istio`),
# every check a named subtest, then the figures side by side. Root. The
# binaries are built once into the cache (`make peer-kube`, run by `make
# test`); `make test` runs the short form (one injected pod of ours: Ready,
# certificate, delete).
.PHONY: peers-kube e2e-kube
peers-kube: peer-kube
e2e-kube:
	@mkdir -p .tmp
	@MESHAGENT_KUBE=full $(GO) test -count=1 -timeout 45m -run '^TestKube$$' -v ./cmd/meshagent/e2e/kube >.tmp/e2e-kube.log 2>&1; \
	  rc=$$?; grep -E 'check |figure |--- (FAIL|SKIP)|^(FAIL|ok)' .tmp/e2e-kube.log | sed 's/^ *kube_test.go:[0-9]*: //'; \
	  [ $$rc -eq 0 ] || { echo "details: .tmp/e2e-kube.log"; exit $$rc; }
