package appprobe

import (
	"errors"
	"strings"
	"testing"
	"time"

	networking "istio.io/api/networking/v1alpha3"
)

func TestNewWorkloadProbeDefaultsAndChecks(t *testing.T) {
	if wp, err := NewWorkloadProbe(nil); wp != nil || err != nil {
		t.Fatalf("nil probe = %v, %v; want none", wp, err)
	}
	wp, err := NewWorkloadProbe(&networking.ReadinessProbe{HealthCheckMethod: &networking.ReadinessProbe_HttpGet{
		HttpGet: &networking.HTTPHealthCheckConfig{Port: 8080, Scheme: "https"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if wp.Period != 10*time.Second || wp.Timeout != time.Second || wp.SuccessThreshold != 1 || wp.FailureThreshold != 1 ||
		wp.InitialDelay != 0 || wp.HTTPGet.Path != "/" || wp.HTTPGet.Scheme != "HTTPS" {
		t.Fatalf("Istio's defaults not filled in: %+v %+v", wp, wp.HTTPGet)
	}
	for name, bad := range map[string]*networking.ReadinessProbe{
		"no method":    {PeriodSeconds: 5},
		"empty exec":   {HealthCheckMethod: &networking.ReadinessProbe_Exec{Exec: &networking.ExecHealthCheckConfig{}}},
		"no tcp port":  {HealthCheckMethod: &networking.ReadinessProbe_TcpSocket{TcpSocket: &networking.TCPHealthCheckConfig{}}},
		"bad scheme":   {HealthCheckMethod: &networking.ReadinessProbe_HttpGet{HttpGet: &networking.HTTPHealthCheckConfig{Port: 1, Scheme: "gopher"}}},
		"grpc port":    {HealthCheckMethod: &networking.ReadinessProbe_Grpc{Grpc: &networking.GrpcHealthCheckConfig{Port: 70000}}},
		"negative ttl": {TimeoutSeconds: -1, HealthCheckMethod: &networking.ReadinessProbe_TcpSocket{TcpSocket: &networking.TCPHealthCheckConfig{Port: 1}}},
	} {
		if _, err := NewWorkloadProbe(bad); !errors.Is(err, ErrInvalidWorkloadProbe) || !strings.Contains(err.Error(), "readinessProbe") {
			t.Errorf("%s: %v; want ErrInvalidWorkloadProbe naming readinessProbe", name, err)
		}
	}
}
