package main

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/spf13/cobra"

	"github.com/meshagent/meshagent/cmd/meshagent/internal/boundedhttp"
)

// newWaitCommand is Istio's `pilot-agent wait`: poll the readiness URL
// until it answers 200 or the timeout passes.
func newWaitCommand() *cobra.Command {
	var (
		timeoutSeconds       int
		requestTimeoutMillis int
		periodMillis         int
		url                  string
	)
	cmd := &cobra.Command{
		Use:   "wait",
		Short: "Waits until the Envoy proxy is ready",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch {
			case timeoutSeconds <= 0:
				return usageError("wait: --timeoutSeconds %d must be positive", timeoutSeconds)
			case requestTimeoutMillis <= 0:
				return usageError("wait: --requestTimeoutMillis %d must be positive", requestTimeoutMillis)
			case periodMillis <= 0:
				return usageError("wait: --periodMillis %d must be positive", periodMillis)
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "Waiting for Envoy proxy to be ready (timeout: %d seconds)...\n", timeoutSeconds)
			client := boundedhttp.Client(time.Duration(requestTimeoutMillis) * time.Millisecond)
			deadline := time.Now().Add(time.Duration(timeoutSeconds) * time.Second)
			var lastErr error
			for {
				if lastErr = checkReady(cmd.Context(), client, url); lastErr == nil {
					fmt.Fprintln(out, "Envoy is ready!")
					return nil
				}
				if time.Now().After(deadline) {
					return fmt.Errorf("timeout waiting for Envoy proxy to become ready. Last error: %v", lastErr)
				}
				time.Sleep(time.Duration(periodMillis) * time.Millisecond)
			}
		},
	}
	fl := cmd.Flags()
	fl.IntVar(&timeoutSeconds, "timeoutSeconds", 60, "maximum number of seconds to wait for Envoy to be ready")
	fl.IntVar(&requestTimeoutMillis, "requestTimeoutMillis", 500, "number of milliseconds to wait for response")
	fl.IntVar(&periodMillis, "periodMillis", 500, "number of milliseconds to wait between attempts")
	fl.StringVar(&url, "url", "http://localhost:15021/healthz/ready", "URL to use in requests")
	return cmd
}

func checkReady(ctx context.Context, client *http.Client, url string) error {
	if ctx == nil {
		ctx = context.Background()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("HTTP status code %v: %s", resp.StatusCode, boundedhttp.Excerpt(resp.Body))
	}
	return nil
}
