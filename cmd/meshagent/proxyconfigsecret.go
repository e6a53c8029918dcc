package main

// `meshagent proxy-config secret` and `rootca-compare` (#35): what Envoy
// holds beside what the agent serves over SDS (its /debug/certs).

import (
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"slices"
	"time"

	"github.com/spf13/cobra"

	"github.com/meshagent/meshagent/cmd/meshagent/envoyadmin"
	"github.com/meshagent/meshagent/services/status"
)

// agentCerts is the agent's /debug/certs at addr: what it serves over SDS.
func agentCerts(addr string) (*status.CertReport, []byte, error) {
	body, err := getStatusDoc(addr, "/debug/certs")
	if err != nil {
		return nil, nil, err
	}
	if body == nil {
		return nil, nil, fmt.Errorf("the agent at %s serves no certificate (no /debug/certs: no identity)", addr)
	}
	var c status.CertReport
	if err := json.Unmarshal(body, &c); err != nil {
		return nil, nil, fmt.Errorf("%s/debug/certs: %w", addr, err)
	}
	if !c.Reported {
		return nil, nil, fmt.Errorf("the agent at %s has no certificate yet", addr)
	}
	return &c, body, nil
}

// newRootCACompareView is istioctl's rootca-compare turned to the pod: the
// roots the agent serves over SDS (ROOTCA; its /debug/certs) against the
// ROOTCA Envoy holds. Identical: exit 0; Envoy lacking one of the agent's
// roots, or holding no ROOTCA: exit 1, as istioctl's mismatch.
func newRootCACompareView(common *proxyConfigFlags) *cobra.Command {
	return &cobra.Command{
		Use: "rootca-compare", Aliases: []string{"rc"}, Args: cobra.NoArgs,
		Short: "Compares the roots the agent serves over SDS with the ROOTCA Envoy holds",
		RunE: func(cmd *cobra.Command, _ []string) error {
			certs, _, err := agentCerts(common.status)
			if err != nil {
				return fmt.Errorf("proxy-config rootca-compare: %w", err)
			}
			dump, err := fetchConfigDump(common.admin, false)
			if err != nil {
				return fmt.Errorf("proxy-config rootca-compare: %w", err)
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "AGENT (SDS ROOTCA, %s/debug/certs):\n", common.status)
			for _, fp := range certs.RootSHA256 {
				fmt.Fprintf(w, "  %s\n", fp)
			}
			rootCA := dump.Secret("ROOTCA")
			if rootCA == nil {
				return fmt.Errorf("proxy-config rootca-compare: Envoy at %s holds no ROOTCA secret (it has not asked the agent for it over SDS)", common.admin)
			}
			held := rootFingerprints(rootCA.GetValidationContext().GetTrustedCa().GetInlineBytes(),
				rootCA.GetValidationContext().GetTrustedCa().GetInlineString())
			fmt.Fprintf(w, "ENVOY (ROOTCA in its config_dump, %s):\n", common.admin)
			for _, fp := range held {
				fmt.Fprintf(w, "  %s\n", fp)
			}
			var missing []string
			for _, fp := range certs.RootSHA256 {
				if !slices.Contains(held, fp) {
					missing = append(missing, fp)
				}
			}
			if len(missing) > 0 || len(certs.RootSHA256) == 0 {
				return fmt.Errorf("proxy-config rootca-compare: Envoy's ROOTCA lacks %d of the agent's %d roots: Envoy would not trust peers of the agent's mesh", len(missing), len(certs.RootSHA256))
			}
			if extra := len(held) - len(certs.RootSHA256); extra > 0 {
				fmt.Fprintf(w, "Envoy holds every root the agent serves, and %d more (ProxyConfig's trust anchors)\n", extra)
				return nil
			}
			fmt.Fprintln(w, "Envoy holds the roots the agent serves: identical ROOTCA")
			return nil
		},
	}
}

// rootFingerprints are the SHA-256 fingerprints of the certificates of a
// PEM data source (inline bytes, else the inline string).
func rootFingerprints(inline []byte, inlineString string) []string {
	rest := inline
	if len(rest) == 0 {
		rest = []byte(inlineString)
	}
	var out []string
	for {
		var block *pem.Block
		if block, rest = pem.Decode(rest); block == nil {
			return out
		}
		if block.Type == "CERTIFICATE" {
			if _, err := x509.ParseCertificate(block.Bytes); err == nil {
				out = append(out, status.Fingerprint(block.Bytes))
			}
		}
	}
}

// newSecretView is istioctl's `proxy-config secret`: the secrets Envoy
// holds; when its dump holds none (it has asked for none over SDS), the
// secrets the agent serves, from its /debug/certs, saying so.
func newSecretView(common *proxyConfigFlags) *cobra.Command {
	return proxyConfigView("secret", []string{"secrets", "s"},
		"Envoy's secrets: type, status, serial number and validity (the agent's SDS secrets when Envoy holds none)",
		&common.output, []string{"short", "json", "yaml"}, func(cmd *cobra.Command) error {
			dump, err := fetchConfigDump(common.admin, false)
			if err != nil {
				return fmt.Errorf("proxy-config secret: %w", err)
			}
			w := cmd.OutOrStdout()
			now := time.Now()
			if t := dump.SecretTable(now); len(t.Rows) > 0 {
				return writeProxyConfig(w, t, common.output)
			}
			certs, raw, err := agentCerts(common.status)
			if err != nil {
				return fmt.Errorf("proxy-config secret: Envoy's config_dump holds no secret, and the agent's: %w", err)
			}
			note := fmt.Sprintf("Envoy's config_dump holds no secret (Envoy has asked for none over SDS); showing what the agent serves over SDS (%s/debug/certs)", common.status)
			if common.output != "short" {
				// The note on stderr: stdout stays the document.
				fmt.Fprintln(cmd.ErrOrStderr(), note)
				return writeDocument(w, raw, common.output)
			}
			fmt.Fprintln(w, note+":")
			return writeProxyConfig(w, agentSecretTable(certs, now), "short")
		})
}

// agentSecretTable is the secret table of what the agent serves: "default"
// (its certificate) and "ROOTCA" (the first root), in istioctl's columns.
func agentSecretTable(c *status.CertReport, now time.Time) envoyadmin.Table {
	t := envoyadmin.Table{Header: []string{"RESOURCE NAME", "TYPE", "STATUS", "VALID CERT", "SERIAL NUMBER", "NOT AFTER", "NOT BEFORE"}}
	row := func(name, kind, serial string, notBefore, notAfter time.Time) {
		valid := !now.Before(notBefore) && !now.After(notAfter)
		t.Rows = append(t.Rows, []string{name, kind, "ACTIVE (agent)", fmt.Sprint(valid), serial,
			notAfter.UTC().Format(time.RFC3339), notBefore.UTC().Format(time.RFC3339)})
	}
	if c.Error == "" && c.NotBefore != nil && c.NotAfter != nil {
		row("default", "Cert Chain", c.Serial, *c.NotBefore, *c.NotAfter)
	}
	if len(c.Roots) > 0 {
		r := c.Roots[0]
		row("ROOTCA", "CA", r.Serial, r.NotBefore, r.NotAfter)
	}
	return t
}
