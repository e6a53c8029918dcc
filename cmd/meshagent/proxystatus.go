package main

// `meshagent proxy-status` (issue 22): istioctl proxy-status seen from
// inside the pod, where the truth is and where it still works while istiod
// is down: per xDS type what the control plane last sent, what Envoy ACKed,
// and the verdict (SYNCED, STALE, NACKED with Envoy's error, SERVING
// CACHE). It reads the status server's /debug/xds (loopback only).

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
)

// proxyStatus is /debug/xds as the command reads it.
type proxyStatus struct {
	Reported  bool                       `json:"reported"`
	Upstream  string                     `json:"upstream"`
	Address   string                     `json:"address"`
	Since     *time.Time                 `json:"since"`
	LastError string                     `json:"last_error"`
	Types     map[string]proxyStatusType `json:"types"`
}

type proxyStatusType struct {
	Short         string    `json:"short"`
	Verdict       string    `json:"verdict"`
	SentVersion   string    `json:"sent_version"`
	SentNonce     string    `json:"sent_nonce"`
	SentResources int       `json:"sent_resources"`
	SentAt        time.Time `json:"sent_at"`
	ACKedVersion  string    `json:"acked_version"`
	NACKs         int       `json:"nacks"`
	NACK          *struct {
		Version string    `json:"version"`
		Error   string    `json:"error"`
		At      time.Time `json:"at"`
	} `json:"nack"`
}

func newProxyStatusCommand() *cobra.Command {
	var addr, output string
	cmd := &cobra.Command{
		Use:   "proxy-status",
		Short: "Shows, per xDS type, what the control plane sent, what Envoy ACKed or NACKed, and the verdict",
		Example: "  meshagent proxy-status\n  meshagent proxy-status -o json\n" +
			"  kubectl exec POD -c istio-proxy -- pilot-agent proxy-status",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if output != "table" && output != "json" {
				return usageError("proxy-status: -o %q: want table or json", output)
			}
			url := "http://" + addr + "/debug/xds"
			resp, err := (&http.Client{Timeout: 10 * time.Second}).Get(url)
			if err != nil {
				return fmt.Errorf("proxy-status: %w (is the agent running, with its status port at %s?)", err, addr)
			}
			defer resp.Body.Close()
			body, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
			if err != nil {
				return fmt.Errorf("proxy-status: reading %s: %w", url, err)
			}
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("proxy-status: GET %s: %s (an agent without an XDS proxy has no xDS status)", url, resp.Status)
			}
			if output == "json" {
				_, err := cmd.OutOrStdout().Write(body)
				return err
			}
			var st proxyStatus
			if err := json.Unmarshal(body, &st); err != nil {
				return fmt.Errorf("proxy-status: %s: %w", url, err)
			}
			return writeProxyStatus(cmd.OutOrStdout(), st)
		},
	}
	cmd.Flags().StringVar(&addr, "addr", "localhost:15020", "the agent's status server (host:port)")
	cmd.Flags().StringVarP(&output, "output", "o", "table", "table or json")
	return cmd
}

// writeProxyStatus prints the upstream line, then one row per type.
func writeProxyStatus(w io.Writer, st proxyStatus) error {
	if !st.Reported {
		_, err := fmt.Fprintln(w, "the XDS proxy has not reported yet")
		return err
	}
	up := st.Upstream + " " + st.Address
	if st.Since != nil {
		up += " since " + st.Since.UTC().Format(time.RFC3339)
	}
	if st.LastError != "" && st.Upstream != "connected" {
		up += " (last error: " + st.LastError + ")"
	}
	fmt.Fprintf(w, "CONTROL PLANE: %s\n", up)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TYPE\tVERDICT\tSENT\tRESOURCES\tSENT AT\tACKED\tNACKS\tENVOY'S ERROR")
	for _, typeURL := range slices.Sorted(maps.Keys(st.Types)) {
		t := st.Types[typeURL]
		nackErr := ""
		if t.NACK != nil {
			nackErr = fmt.Sprintf("(%s at %s) %s", t.NACK.Version, t.NACK.At.UTC().Format(time.RFC3339), strings.NewReplacer("\n", " ", "\t", " ").Replace(t.NACK.Error))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%d\t%s\n", t.Short, t.Verdict, t.SentVersion, t.SentResources,
			t.SentAt.UTC().Format(time.RFC3339), t.ACKedVersion, t.NACKs, nackErr)
	}
	return tw.Flush()
}
