package appprobe

import (
	"context"
	"fmt"
	"net"
	"net/http"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	grpcstatus "google.golang.org/grpc/status"
)

// grpc is kubelet's grpc probe (pkg/probe/grpc, which Istio follows):
// grpc.health.v1.Health/Check for the probe's service over plaintext;
// SERVING is success, any other answer or error is failure. userAgent is
// kubelet's, passed on as kubelet would send it.
func (p *Prober) grpc(ctx context.Context, addr, service, userAgent string) probeResult {
	opts := []grpc.DialOption{
		// kubelet's grpc probe has no TLS either.
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return p.dialer.DialContext(ctx, "tcp", addr)
		}),
	}
	if userAgent != "" {
		opts = append(opts, grpc.WithUserAgent(userAgent))
	}
	// passthrough: addr is an IP or "localhost", dialled as it is.
	conn, err := grpc.NewClient("passthrough:///"+addr, opts...)
	if err != nil {
		return failed(fmt.Errorf("grpc %s: %w", addr, err))
	}
	defer conn.Close()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: service})
	if err != nil {
		switch grpcstatus.Code(err) {
		case codes.Unimplemented:
			return failed(fmt.Errorf("grpc %s does not implement grpc.health.v1.Health: %w", addr, err))
		case codes.DeadlineExceeded:
			return failed(fmt.Errorf("grpc %s: no answer within the probe's timeout: %w", addr, err))
		}
		return failed(fmt.Errorf("grpc %s health check: %w", addr, err))
	}
	if st := resp.GetStatus(); st != healthpb.HealthCheckResponse_SERVING {
		return failed(fmt.Errorf("grpc %s service %q is %s", addr, service, st))
	}
	return probeResult{code: http.StatusOK}
}
