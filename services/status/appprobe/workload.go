package appprobe

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"time"

	networking "istio.io/api/networking/v1alpha3"
)

// The workload probe is the readiness probe the control plane configures
// for a VM workload (WorkloadGroup.probe, delivered as
// ProxyConfig.readinessProbe). This package defines it and runs it once
// (Check); the status server runs it every Period and reports transitions
// upstream (Istio's HealthInformation, issue 13), so that istiod can take
// an unhealthy VM out of its service's endpoints. Istio:
// pkg/istio-agent/health.

// ErrInvalidWorkloadProbe is wrapped by every error NewWorkloadProbe
// returns.
var ErrInvalidWorkloadProbe = errors.New("invalid workload readiness probe")

// workloadProbeUserAgent is what Istio's VM probes send when the probe
// names no User-Agent.
const workloadProbeUserAgent = "istio-probe/1.0"

// WorkloadProbe is a validated ProxyConfig.readinessProbe with Istio's
// defaults filled in. Exactly one of HTTPGet, TCPSocket, GRPC and Exec is
// set.
type WorkloadProbe struct {
	HTTPGet   *HTTPGetAction // Host and HTTPHeaders are honoured
	TCPSocket *TCPSocketAction
	GRPC      *GRPCAction
	Exec      []string // the command and its arguments, run without a shell

	InitialDelay time.Duration // initialDelaySeconds, default 0
	Period       time.Duration // periodSeconds, default 10s
	Timeout      time.Duration // timeoutSeconds, default 1s
	// Consecutive results needed to turn healthy or unhealthy; default 1.
	SuccessThreshold, FailureThreshold int
}

// NewWorkloadProbe validates ProxyConfig.readinessProbe and fills in
// Istio's defaults (health_check.go fillInDefaults); nil is no probe.
func NewWorkloadProbe(p *networking.ReadinessProbe) (*WorkloadProbe, error) {
	if p == nil {
		return nil, nil
	}
	if p.GetInitialDelaySeconds() < 0 || p.GetPeriodSeconds() < 0 || p.GetTimeoutSeconds() < 0 ||
		p.GetSuccessThreshold() < 0 || p.GetFailureThreshold() < 0 {
		return nil, fmt.Errorf("ProxyConfig.readinessProbe: %w: negative seconds or threshold", ErrInvalidWorkloadProbe)
	}
	wp := &WorkloadProbe{
		InitialDelay:     time.Duration(p.GetInitialDelaySeconds()) * time.Second,
		Period:           seconds(p.GetPeriodSeconds(), 10),
		Timeout:          seconds(p.GetTimeoutSeconds(), 1),
		SuccessThreshold: int(orDefault(p.GetSuccessThreshold(), 1)),
		FailureThreshold: int(orDefault(p.GetFailureThreshold(), 1)),
	}
	var err error
	switch {
	case p.GetHttpGet() != nil:
		h := p.GetHttpGet()
		// Istio lower-cases the scheme and then compares it with "HTTPS",
		// so its VM probes of HTTPS applications verify certificates
		// (they fail on a self-signed one); ours skip verification, as
		// kubelet's and the application probes do.
		scheme := strings.ToUpper(h.GetScheme())
		if scheme != "" && scheme != "HTTP" && scheme != "HTTPS" {
			err = fmt.Errorf("httpGet scheme %q: want HTTP or HTTPS", h.GetScheme())
			break
		}
		wp.HTTPGet = &HTTPGetAction{Path: h.GetPath(), Port: ProbePort(h.GetPort()), Host: h.GetHost(), Scheme: scheme}
		if wp.HTTPGet.Path == "" {
			wp.HTTPGet.Path = "/"
		}
		for _, hd := range h.GetHttpHeaders() {
			wp.HTTPGet.HTTPHeaders = append(wp.HTTPGet.HTTPHeaders, HTTPHeader{Name: hd.GetName(), Value: hd.GetValue()})
		}
		err = checkPort(wp.HTTPGet.Port)
	case p.GetTcpSocket() != nil:
		wp.TCPSocket = &TCPSocketAction{Port: ProbePort(p.GetTcpSocket().GetPort()), Host: p.GetTcpSocket().GetHost()}
		err = checkPort(wp.TCPSocket.Port)
	case p.GetGrpc() != nil:
		svc := p.GetGrpc().GetService()
		wp.GRPC = &GRPCAction{Port: ProbePort(p.GetGrpc().GetPort()), Service: &svc}
		err = checkPort(wp.GRPC.Port)
	case p.GetExec() != nil:
		wp.Exec = p.GetExec().GetCommand()
		if len(wp.Exec) == 0 {
			err = errors.New("exec has no command")
		}
	default:
		err = errors.New("no httpGet, tcpSocket, grpc or exec")
	}
	if err != nil {
		return nil, fmt.Errorf("ProxyConfig.readinessProbe: %w: %v", ErrInvalidWorkloadProbe, err)
	}
	return wp, nil
}

func seconds(v, def int32) time.Duration {
	return time.Duration(orDefault(v, def)) * time.Second
}

func orDefault(v, def int32) int32 {
	if v == 0 {
		return def
	}
	return v
}

// Check runs the workload probe once, within its Timeout: healthy, or
// why not. Envoy's readiness, which Istio checks first, is the status
// server's to add.
func (p *Prober) Check(ctx context.Context, wp *WorkloadProbe) (healthy bool, reason string) {
	ctx, cancel := context.WithTimeout(ctx, wp.Timeout)
	defer cancel()
	host := p.host()
	switch {
	case wp.HTTPGet != nil:
		probe := workloadHTTPRequest(wp.HTTPGet, host)
		res := p.http(ctx, probe)
		if !res.healthy() {
			return false, "GET " + probe.url + ": " + res.reason()
		}
	case wp.TCPSocket != nil:
		if wp.TCPSocket.Host != "" {
			host = wp.TCPSocket.Host
		}
		if res := p.tcp(ctx, net.JoinHostPort(host, strconv.Itoa(int(wp.TCPSocket.Port)))); !res.healthy() {
			return false, res.reason()
		}
	case wp.GRPC != nil:
		addr := net.JoinHostPort(host, strconv.Itoa(int(wp.GRPC.Port)))
		if res := p.grpc(ctx, addr, derefOr(wp.GRPC.Service, ""), workloadProbeUserAgent); !res.healthy() {
			return false, res.reason()
		}
	default:
		return runExecProbe(ctx, wp.Exec, wp.Timeout)
	}
	return true, ""
}

// workloadHTTPRequest is the VM probe's request: the probe's own host and
// headers, Istio's User-Agent unless the probe names one.
func workloadHTTPRequest(get *HTTPGetAction, defaultHost string) httpProbe {
	host := defaultHost
	if get.Host != "" {
		host = get.Host
	}
	scheme, path := get.urlScheme(), get.urlPath()
	header := http.Header{}
	for _, h := range get.HTTPHeaders {
		header.Add(h.Name, h.Value)
	}
	if header.Get("User-Agent") == "" {
		header.Set("User-Agent", workloadProbeUserAgent)
	}
	return httpProbe{
		url:    scheme + "://" + net.JoinHostPort(host, strconv.Itoa(int(get.Port))) + path,
		host:   header.Get("Host"),
		header: header,
	}
}

// runExecProbe runs the command; exit status 0 is healthy. The context's
// deadline kills it.
func runExecProbe(ctx context.Context, command []string, timeout time.Duration) (bool, string) {
	cmd := exec.CommandContext(ctx, command[0], command[1:]...)
	// A grandchild that keeps the output pipes open must not hold Wait
	// past the kill.
	cmd.WaitDelay = time.Second
	out, err := cmd.CombinedOutput()
	if err == nil {
		return true, ""
	}
	if ctx.Err() != nil {
		return false, fmt.Sprintf("%s: timed out after %s", command[0], timeout)
	}
	reason := fmt.Sprintf("%s: %v", command[0], err)
	if msg := strings.TrimSpace(string(out)); msg != "" {
		reason += ": " + msg // the status server makes it one line
	}
	return false, reason
}

// Describe is the probe for the start-up log line.
func (p *Prober) Describe(wp *WorkloadProbe) string {
	switch {
	case wp.HTTPGet != nil:
		return workloadHTTPRequest(wp.HTTPGet, p.host()).url
	case wp.TCPSocket != nil:
		return "tcp " + strconv.Itoa(int(wp.TCPSocket.Port))
	case wp.GRPC != nil:
		return "grpc " + strconv.Itoa(int(wp.GRPC.Port))
	}
	return "exec " + strings.Join(wp.Exec, " ")
}
