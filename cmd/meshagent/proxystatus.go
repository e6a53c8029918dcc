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

	"github.com/meshagent/meshagent/cmd/meshagent/internal/boundedhttp"

	"github.com/meshagent/meshagent/services/status"
)

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
			body, err := getStatusDoc(addr, "/debug/xds")
			if err != nil {
				return fmt.Errorf("proxy-status: %w", err)
			}
			if body == nil {
				return fmt.Errorf("proxy-status: GET %s/debug/xds: 404 Not Found (an agent without an XDS proxy has no xDS status)", addr)
			}
			// The certificate and the name table (#22), when the agent has
			// them: an older agent, or one without identity, has no page.
			cert, err := getStatusDoc(addr, "/debug/certs")
			if err != nil {
				return fmt.Errorf("proxy-status: %w", err)
			}
			names, err := getStatusDoc(addr, "/debug/names")
			if err != nil {
				return fmt.Errorf("proxy-status: %w", err)
			}
			if output == "json" {
				return writeProxyStatusJSON(cmd.OutOrStdout(), body, cert, names)
			}
			var st status.XDSReport
			if err := json.Unmarshal(body, &st); err != nil {
				return fmt.Errorf("proxy-status: %s/debug/xds: %w", addr, err)
			}
			if err := writeProxyStatus(cmd.OutOrStdout(), st); err != nil {
				return err
			}
			return writeIdentityStatus(cmd.OutOrStdout(), cert, names)
		},
	}
	cmd.Flags().StringVar(&addr, "addr", "localhost:15020", "the agent's status server (host:port)")
	cmd.Flags().StringVarP(&output, "output", "o", "table", "table or json")
	return cmd
}

// getStatusDoc is the body of GET path on the status server at addr; nil
// when it answers 404.
func getStatusDoc(addr, path string) ([]byte, error) {
	url := "http://" + addr + path
	// The agent's pages are KiBs; the name table's summary, not its names.
	resp, body, err := getLocal(url, 4<<20, "the agent running, with its status port at "+addr)
	if err != nil || resp.StatusCode == http.StatusNotFound {
		return nil, err
	}
	return body, nil
}

// getLocal is GET url on this pod's agent or Envoy: the body of a 200 of
// at most limit bytes (boundedhttp.ErrCut past it, naming the bound), no
// body with a 404, an error quoting the start of any other answer's body
// (#33). what names what should answer there, for the error when nothing
// does.
func getLocal(url string, limit int64, what string) (*http.Response, []byte, error) {
	resp, err := boundedhttp.Client(10 * time.Second).Get(url)
	if err != nil {
		return nil, nil, fmt.Errorf("%w (is %s?)", err, what)
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusNotFound:
		return resp, nil, nil
	default:
		return nil, nil, fmt.Errorf("GET %s: %s: %s", url, resp.Status, boundedhttp.Excerpt(resp.Body))
	}
	body, err := boundedhttp.Read(resp.Body, limit)
	if err != nil {
		return nil, nil, fmt.Errorf("GET %s: %w", url, err)
	}
	return resp, body, nil
}

// writeProxyStatusJSON is /debug/xds, with the certificate and the name
// table added as "certificate" and "names" when the agent has them.
func writeProxyStatusJSON(w io.Writer, xds, cert, names []byte) error {
	if cert == nil && names == nil {
		_, err := w.Write(xds)
		return err
	}
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(xds, &doc); err != nil {
		return fmt.Errorf("proxy-status: /debug/xds: %w", err)
	}
	if cert != nil {
		doc["certificate"] = cert
	}
	if names != nil {
		doc["names"] = names
	}
	out, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(w, string(out))
	return err
}

// writeIdentityStatus prints the certificate and the name table lines,
// each when the agent has one.
func writeIdentityStatus(w io.Writer, cert, names []byte) error {
	if cert != nil {
		var c status.CertReport
		if err := json.Unmarshal(cert, &c); err != nil {
			return fmt.Errorf("proxy-status: /debug/certs: %w", err)
		}
		switch {
		case !c.Reported:
			fmt.Fprintln(w, "CERTIFICATE: none yet")
		case c.Error != "":
			fmt.Fprintf(w, "CERTIFICATE: unreadable: %s\n", c.Error)
		default:
			left := (time.Duration(c.RemainingSeconds) * time.Second).String() + " left"
			if c.RemainingSeconds < 0 {
				left = "EXPIRED"
			}
			fmt.Fprintf(w, "CERTIFICATE: %s serial %s valid %s to %s (%s)\n", strings.Join(c.SANs, ","), c.Serial,
				c.NotBefore.UTC().Format(time.RFC3339), c.NotAfter.UTC().Format(time.RFC3339), left)
			if c.RenewAt != nil {
				fmt.Fprintf(w, "NEXT RENEWAL: %s\n", c.RenewAt.UTC().Format(time.RFC3339))
			}
			for _, fp := range c.RootSHA256 {
				fmt.Fprintf(w, "ROOT SHA-256: %s\n", fp)
			}
		}
	}
	if names != nil {
		var n status.NamesReport
		if err := json.Unmarshal(names, &n); err != nil {
			return fmt.Errorf("proxy-status: /debug/names: %w", err)
		}
		if !n.Reported {
			fmt.Fprintln(w, "DNS TABLE: none yet")
		} else {
			fmt.Fprintf(w, "DNS TABLE: %d names, version %s, from %s\n", n.Names, n.Version, n.Source)
		}
	}
	return nil
}

// writeProxyStatus prints the upstream line, then one row per type.
func writeProxyStatus(w io.Writer, st status.XDSReport) error {
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
