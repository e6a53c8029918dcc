package main

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/meshagent/meshagent/cmd/meshagent/internal/boundedhttp"
)

// requestPorts are the local ports `request` may call, as in Istio: Envoy's
// admin, Envoy's health, the agent's status, and istiod's debug port.
var requestPorts = []int{15000, 15021, 15020, 15004}

// maxRequestAnswer bounds what `request` prints (#33): Envoy's largest
// answers, /config_dump?include_eds and /stats of a large mesh, run to
// tens of MiB. The answer is streamed, so the bound is time and output,
// not memory.
const maxRequestAnswer = 1 << 30

// newRequestCommand is Istio's `pilot-agent request METHOD PATH [BODY]`:
// call a local admin endpoint (Envoy's by default) and print the answer.
func newRequestCommand() *cobra.Command {
	var debugPort int
	cmd := &cobra.Command{
		Use:     "request <method> <path> [<body>]",
		Short:   "Makes an HTTP request to the Envoy admin API",
		Example: "  meshagent request GET /stats\n  meshagent request --debug-port 15020 POST drain",
		Args:    cobra.RangeArgs(2, 3),
		RunE: func(cmd *cobra.Command, args []string) error {
			allowed := false
			for _, p := range requestPorts {
				allowed = allowed || p == debugPort
			}
			if !allowed {
				return usageError("request: --debug-port %d is not one of %v", debugPort, requestPorts)
			}
			method := strings.ToUpper(args[0])
			path := strings.TrimPrefix(args[1], "/")
			var body io.Reader
			if len(args) == 3 {
				body = strings.NewReader(args[2])
			}
			url := fmt.Sprintf("http://localhost:%d/%s", debugPort, path)
			req, err := http.NewRequestWithContext(cmd.Context(), method, url, body)
			if err != nil {
				return usageError("request %s %s: %v", method, url, err)
			}
			resp, err := boundedhttp.Client(60 * time.Second).Do(req)
			if err != nil {
				return fmt.Errorf("request %s %s: %w", method, url, err)
			}
			defer resp.Body.Close()
			if resp.StatusCode > 399 && resp.StatusCode != http.StatusNotFound {
				return fmt.Errorf("request %s %s: %s: %s", method, url, resp.Status, boundedhttp.Excerpt(resp.Body))
			}
			// Streamed, not held (#33: an endless body was an OOM kill).
			if _, err := boundedhttp.Copy(cmd.OutOrStdout(), resp.Body, maxRequestAnswer); err != nil {
				return fmt.Errorf("request %s %s: reading the answer: %w", method, url, err)
			}
			return nil
		},
	}
	cmd.Flags().IntVar(&debugPort, "debug-port", 15000, "Set the port to make a local request to. The default points to the Envoy admin API.")
	return cmd
}
