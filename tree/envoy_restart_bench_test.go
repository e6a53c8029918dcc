package tree

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	meshconfig "istio.io/api/mesh/v1alpha1"

	"github.com/meshagent/meshagent/services/envoy/bootstrap"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/services/envoy"
	"github.com/meshagent/meshagent/testdata/testkit"
	"github.com/meshagent/meshagent/testdata/testkit/xdsserver"
)

// The Envoy restart benchmarks: SIGKILL → the next Envoy process running,
// through the real envoy service, runner and default restart policy, and the
// same with a bare os/exec loop as the baseline. Each kill hits a ready
// Envoy that has run past the policy's healthy period (shortened here so
// that 20 kills take seconds, not the production 30 s each): the case of a
// crash in production, which must cost the pod milliseconds. Run with
// -benchtime 20x (make bench-envoy); they report p50 and max.

// restartBenchHealthy stands for the policy's HealthyAfter.
const restartBenchHealthy = 150 * time.Millisecond

func BenchmarkEnvoyKillToNextRunning(b *testing.B) {
	bin, boot, args, admin := fakeEnvoyForBench(b)
	ch := NewChannels(nil)
	log := slog.New(slog.DiscardHandler)
	rt := messages.NewRuntime(envoy.Name, ch.Health, nil, nil, log)
	svc, err := envoy.New(envoy.Config{
		BinaryPath: bin, Bootstrap: boot, Args: args,
		AdminAddr: admin, DrainQuery: "inboundonly&graceful", Stdout: io.Discard, Stderr: io.Discard,
	}, envoy.Inputs{Drain: ch.Drain}, envoy.Outputs{State: ch.Envoy}, rt)
	if err != nil {
		b.Fatal(err)
	}
	p := DefaultPolicy()
	p.HealthyAfter = restartBenchHealthy
	a, err := New(ch, []Node{{Service: svc, Health: rt.Health, Policy: &p}}, prometheus.NewRegistry(), log, Options{})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	defer func() {
		b.StopTimer()
		ch.Shutdown.Send(messages.Shutdown{Reason: "benchmark done"}) // not graceful: no drain
		<-done
		cancel()
	}()

	waitEnvoy := func(what string, cond func(messages.EnvoyState) bool) messages.EnvoyState {
		timeout := time.After(20 * time.Second)
		for {
			st, _, changed := ch.Envoy.Watch()
			if cond(st) {
				return st
			}
			select {
			case <-changed:
			case <-timeout:
				b.Fatalf("timed out waiting for Envoy %s (last %+v)", what, st)
			}
		}
	}
	var took []time.Duration
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		st := waitEnvoy("ready", func(s messages.EnvoyState) bool { return s.Phase == messages.EnvoyReady })
		<-time.After(time.Until(st.Started.Add(restartBenchHealthy)))
		b.StartTimer()
		start := time.Now()
		if err := syscall.Kill(st.PID, syscall.SIGKILL); err != nil {
			b.Fatal(err)
		}
		waitEnvoy("running again", func(s messages.EnvoyState) bool { return s.Phase.Alive() && s.PID != st.PID })
		took = append(took, time.Since(start))
	}
	b.StopTimer()
	reportSpread(b, took)
}

// BenchmarkExecKillToNextRunning is the baseline: the least any supervisor
// can do — reap the killed process and start the same binary again.
func BenchmarkExecKillToNextRunning(b *testing.B) {
	bin, boot, args, admin := fakeEnvoyForBench(b)
	cmdline := envoy.CommandLine(args, bootstrap.File{Path: boot.CustomConfigFile})
	start := func() *exec.Cmd {
		cmd := exec.Command(bin, cmdline...)
		cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		return cmd
	}
	cmd := start()
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	var took []time.Duration
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		waitAdminReady(b, admin)
		b.StartTimer()
		t0 := time.Now()
		if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
			b.Fatal(err)
		}
		_ = cmd.Wait()
		cmd = start()
		took = append(took, time.Since(t0))
	}
	b.StopTimer()
	reportSpread(b, took)
}

func reportSpread(b *testing.B, took []time.Duration) {
	slices.Sort(took)
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	b.ReportMetric(ms(took[len(took)/2]), "p50-ms")
	b.ReportMetric(ms(took[len(took)-1]), "max-ms")
}

// fakeEnvoyForBench builds the stand-in Envoy and writes a minimal
// bootstrap: the admin API on a free loopback port, and delta ADS over the
// xds-grpc pipe to a control plane serving a small mesh, from which Envoy
// (the stand-in, as Envoy) turns ready.
func fakeEnvoyForBench(b *testing.B) (bin string, boot *bootstrap.Config, args envoy.ArgsConfig, admin string) {
	b.Helper()
	dir := b.TempDir()
	bin = filepath.Join(dir, "fakeenvoy")
	if out, err := exec.Command("go", "build", "-o", bin, "../testdata/fakeenvoy").CombinedOutput(); err != nil {
		b.Fatalf("go build testdata/fakeenvoy: %v\n%s", err, out)
	}
	sock := filepath.Join(dir, "XDS")
	cp, err := xdsserver.StartSmallMesh(xdsserver.Options{Addr: "unix:" + sock}, "default", nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(cp.Close)
	port := testkit.FreePort(b)
	raw := fmt.Sprintf(`{"node":{"id":"sidecar~127.0.0.1~bench.default~default.svc.cluster.local","cluster":"bench.default"},
 "admin":{"address":{"socketAddress":{"address":"127.0.0.1","portValue":%d}}},
 "dynamicResources":{"ldsConfig":{"ads":{},"resourceApiVersion":"V3"},"cdsConfig":{"ads":{},"resourceApiVersion":"V3"},
  "adsConfig":{"apiType":"DELTA_GRPC","transportApiVersion":"V3","grpcServices":[{"envoyGrpc":{"clusterName":"xds-grpc"}}]}},
 "staticResources":{"clusters":[{"name":"xds-grpc","type":"STATIC","connectTimeout":"1s","loadAssignment":{"clusterName":"xds-grpc",
  "endpoints":[{"lbEndpoints":[{"endpoint":{"address":{"pipe":{"path":%q}}}}]}]}}]}}`, port, sock)
	path := filepath.Join(dir, "envoy-rev.json")
	if err := os.WriteFile(path, []byte(raw), 0o600); err != nil {
		b.Fatal(err)
	}
	// The bootstrap is the custom config file, used as is.
	boot = &bootstrap.Config{ProxyType: "sidecar", InstanceIPs: []string{"127.0.0.1"}, Proxy: &meshconfig.ProxyConfig{},
		ConfigPath: dir, AdminPort: port, StatusPort: 15020, EnvoyStatusPort: 15021, EnvoyPrometheusPort: 15090,
		CustomConfigFile: path}
	return bin, boot, envoy.ArgsConfig{LogLevel: "warning", Concurrency: 1}, fmt.Sprintf("127.0.0.1:%d", port)
}

func waitAdminReady(b *testing.B, addr string) {
	b.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := http.Get("http://" + addr + "/ready")
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		<-time.After(5 * time.Millisecond)
	}
	b.Fatalf("Envoy admin %s never ready", addr)
}
