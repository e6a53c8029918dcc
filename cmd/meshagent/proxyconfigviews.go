package main

// istioctl's remaining proxy-config views, from inside the pod (#35):
// bootstrap, all, log (Envoy's log levels through its admin POST
// /logging), rootca-compare (the roots the agent serves over SDS against
// Envoy's ROOTCA), and secret's fallback to the agent's own SDS secrets
// when Envoy's dump holds none. Each reads Envoy through fetchConfigDump
// or getLocal and the agent through getStatusDoc, the commands' one way to
// ask the pod.

import (
	"bytes"
	"cmp"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	adminv3 "github.com/envoyproxy/go-control-plane/envoy/admin/v3"
	"github.com/spf13/cobra"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/meshagent/meshagent/cmd/meshagent/envoyadmin"
	"github.com/meshagent/meshagent/services/status"
)

// unknownView answers `proxy-config NAME` for a NAME that is no view: exit
// 2 with cobra's suggestion, where cobra alone prints the help and exits 0
// (it checks sub-command names only under the root). No NAME prints the
// help, as istioctl does.
func unknownView(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		return cmd.Help()
	}
	if cmd.SuggestionsMinimumDistance <= 0 {
		cmd.SuggestionsMinimumDistance = 2 // cobra's default, set only under the root
	}
	msg := fmt.Sprintf("unknown view %q for %q", args[0], cmd.CommandPath())
	if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
		msg += "; did you mean " + strings.Join(s, " or ") + "?"
	}
	var views []string
	for _, c := range cmd.Commands() {
		if c.IsAvailableCommand() {
			views = append(views, c.Name())
		}
	}
	return usageError("%s (views: %s)", msg, strings.Join(views, ", "))
}

// checkOutput refuses an -o the view does not print.
func checkOutput(view, output string, allowed ...string) error {
	if !slices.Contains(allowed, output) {
		return usageError("proxy-config %s: -o %q: want %s", view, output, strings.Join(allowed, ", "))
	}
	return nil
}

// newBootstrapView is istioctl's `proxy-config bootstrap`: the bootstrap
// dump as JSON (its default) or YAML, or the versions (-o short).
func newBootstrapView(common *proxyConfigFlags) *cobra.Command {
	var output string
	c := &cobra.Command{
		Use: "bootstrap", Aliases: []string{"b"}, Args: cobra.NoArgs,
		Short: "Envoy's bootstrap: node, static resources, admin (JSON by default, as istioctl)",
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput("bootstrap", output, "json", "yaml", "short"); err != nil {
				return err
			}
			dump, err := fetchConfigDump(common.admin, false)
			if err != nil {
				return fmt.Errorf("proxy-config bootstrap: %w", err)
			}
			b := dump.Bootstrap()
			if b == nil {
				return fmt.Errorf("proxy-config bootstrap: Envoy's config_dump at %s holds no bootstrap", common.admin)
			}
			if output == "short" {
				return writeBootstrapSummary(cmd.OutOrStdout(), b)
			}
			return writeProto(cmd.OutOrStdout(), b, output)
		},
	}
	// istioctl's bootstrap defaults to json: a local -o over the parent's.
	c.Flags().StringVarP(&output, "output", "o", "json", "json, yaml or short")
	return c
}

// writeBootstrapSummary is istioctl's bootstrap summary (Istio's version,
// Istio's proxy version, Envoy's version), with the node it announces.
func writeBootstrapSummary(w io.Writer, b *adminv3.BootstrapConfigDump) error {
	node := b.GetBootstrap().GetNode()
	md := node.GetMetadata().GetFields()
	tw := tabwriter.NewWriter(w, 0, 8, 1, ' ', 0)
	fmt.Fprintf(tw, "Node:\t%s\n", node.GetId())
	if v := md["ISTIO_VERSION"].GetStringValue(); v != "" {
		fmt.Fprintf(tw, "Istio Version:\t%s\n", v)
	}
	if sha := md["ISTIO_PROXY_SHA"].GetStringValue(); sha != "" {
		if _, after, ok := strings.Cut(sha, ":"); ok {
			sha = after
		}
		fmt.Fprintf(tw, "Istio Proxy Version:\t%s\n", sha)
	}
	if bv := node.GetUserAgentBuildVersion(); bv != nil {
		v := bv.GetVersion()
		version := fmt.Sprintf("%d.%d.%d", v.GetMajorNumber(), v.GetMinorNumber(), v.GetPatch())
		bmd := bv.GetMetadata().GetFields()
		for _, f := range []struct{ key, sep string }{{"build.label", "-"}, {"revision.status", "/"}, {"build.type", "/"}, {"ssl.version", "/"}} {
			if s := bmd[f.key].GetStringValue(); s != "" {
				version += f.sep + s
			}
		}
		fmt.Fprintf(tw, "Envoy Version:\t%s\n", version)
	}
	return tw.Flush()
}

// writeProto prints one message as istioctl does: protobuf JSON indented
// by four, or that as YAML. Indented by encoding/json: protojson's own
// spacing varies from build to build on purpose.
func writeProto(w io.Writer, m proto.Message, output string) error {
	out, err := protojson.MarshalOptions{Resolver: envoyadmin.Resolver}.Marshal(m)
	if err != nil {
		return err
	}
	var indented bytes.Buffer
	if err := json.Indent(&indented, out, "", "    "); err != nil {
		return err
	}
	return writeDocument(w, indented.Bytes(), output)
}

// newAllView is istioctl's `proxy-config all`: every table in turn (-o
// short), or Envoy's whole dump with its endpoints, as Envoy wrote it
// (-o json) or as YAML.
func newAllView(common *proxyConfigFlags) *cobra.Command {
	var withHeaders bool
	c := &cobra.Command{
		Use: "all", Aliases: []string{"a"}, Args: cobra.NoArgs,
		Short: "Everything: bootstrap, clusters, listeners, routes, secrets and endpoints (-o json: Envoy's whole config_dump)",
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput("all", common.output, "short", "json", "yaml"); err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			if common.output != "short" {
				return writeRawDump(w, common.admin, common.output)
			}
			dump, err := fetchConfigDump(common.admin, true)
			if err != nil {
				return fmt.Errorf("proxy-config all: %w", err)
			}
			header := func(title string) {
				if withHeaders {
					fmt.Fprintf(w, "%s\n%s\n", title, strings.Repeat("-", len(title)))
				}
			}
			header("BOOTSTRAP INFO")
			if err := writeBootstrapSummary(w, dump.Bootstrap()); err != nil {
				return err
			}
			for _, section := range []struct {
				title string
				table envoyadmin.Table
			}{
				{"CLUSTER INFO", dump.ClusterTable(envoyadmin.ClusterFilter{})},
				{"LISTENER INFO", dump.ListenerTable(envoyadmin.ListenerFilter{})},
				{"ROUTE INFO", dump.RouteTable(envoyadmin.RouteFilter{})},
				{"SECRET INFO", dump.SecretTable(time.Now())},
				{"ENDPOINTS INFO", dump.EndpointTable(envoyadmin.EndpointFilter{})},
			} {
				fmt.Fprintln(w)
				header(section.title)
				if err := writeProxyConfig(w, section.table, "short"); err != nil {
					return err
				}
			}
			return nil
		},
	}
	c.Flags().BoolVar(&withHeaders, "with-headers", false, "a title above each table, as istioctl's")
	return c
}

// writeRawDump prints Envoy's /config_dump?include_eds as Envoy wrote it
// (its field names, the configs of types this binary does not link in
// whole), or as YAML; refusing a body that is no config dump.
func writeRawDump(w io.Writer, admin, output string) error {
	url := "http://" + admin + "/config_dump?include_eds"
	resp, body, err := getLocal(url, 256<<20, "Envoy running, with its admin API at "+admin)
	if err != nil {
		return fmt.Errorf("proxy-config all: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("proxy-config all: GET %s: %s", url, resp.Status)
	}
	if _, err := envoyadmin.Decode(body); err != nil {
		return fmt.Errorf("proxy-config all: %s: %w", url, err)
	}
	return writeDocument(w, body, output)
}

// envoyLogLevels are istioctl's level names (proxyconfig.go stringToLevel),
// each as Envoy's admin takes it.
var envoyLogLevels = map[string]string{"trace": "trace", "debug": "debug", "info": "info", "warning": "warning",
	"warn": "warning", "error": "error", "critical": "critical", "off": "off"}

// newLogView is istioctl's `proxy-config log`: Envoy's loggers and their
// levels, set with --level (LEVEL for all, or LOGGER:LEVEL,...) or reset
// with --reset, each a POST /logging to Envoy's admin, as istioctl does.
// Reset restores the levels Envoy was started with (its /server_info's
// log_level and component_log_level: the agent's --proxyLogLevel and
// --proxyComponentLogLevel), where istioctl takes the mesh's injector
// default, which the pod has no access to.
func newLogView(common *proxyConfigFlags) *cobra.Command {
	var level string
	var reset bool
	c := &cobra.Command{
		Use: "log", Aliases: []string{"o"}, Args: cobra.NoArgs,
		Short: "Envoy's log levels; --level to set them, --reset to go back to those Envoy started with",
		Example: "  meshagent proxy-config log\n  meshagent proxy-config log --level debug\n" +
			"  meshagent proxy-config log --level http:debug,router:trace\n  meshagent proxy-config log --reset",
		RunE: func(cmd *cobra.Command, _ []string) error {
			if reset && level != "" {
				return usageError("proxy-config log: --level cannot be combined with --reset")
			}
			if common.output != "short" {
				return usageError("proxy-config log: -o %q: --output is not applicable for this command", common.output)
			}
			var queries []string
			var err error
			switch {
			case reset:
				queries, err = startLogLevels(common.admin)
			case level != "":
				queries, err = logLevelQueries(level)
			}
			if err != nil {
				return err
			}
			if len(queries) == 0 {
				queries = []string{""}
			}
			var last []byte
			for _, q := range queries {
				if last, err = postLogging(common.admin, q); err != nil {
					return err
				}
			}
			_, err = cmd.OutOrStdout().Write(last)
			return err
		},
	}
	c.Flags().StringVar(&level, "level", "", "LEVEL for every logger, or LOGGER:LEVEL,... (levels: trace, debug, info, warning, error, critical, off)")
	c.Flags().BoolVarP(&reset, "reset", "r", false, "set the levels Envoy was started with")
	return c
}

// logLevelQueries are the POST /logging queries of a --level value, in
// istioctl's order: the level of all loggers first, then each named one.
func logLevelQueries(value string) ([]string, error) {
	var all string
	var named []string
	for part := range strings.SplitSeq(value, ",") {
		// A logger may be given with its namespace (istioctl: a::b:level).
		if i := strings.LastIndex(part, "::"); i >= 0 {
			part = part[i+2:]
		}
		name, lvl := "", part
		if i := strings.IndexAny(part, ":="); i >= 0 {
			name, lvl = part[:i], part[i+1:]
		}
		envoyLevel, ok := envoyLogLevels[strings.TrimSpace(lvl)]
		if !ok {
			return nil, usageError("proxy-config log: --level %q: unrecognized logging level %q (want trace, debug, info, warning, error, critical or off)", value, lvl)
		}
		if name == "" || name == "level" {
			all = "level=" + envoyLevel
			continue
		}
		named = append(named, name+"="+envoyLevel)
	}
	if all != "" {
		return append([]string{all}, named...), nil
	}
	return named, nil
}

// startLogLevels are the queries that restore the levels of Envoy's
// command line, read from its /server_info.
func startLogLevels(admin string) ([]string, error) {
	url := "http://" + admin + "/server_info"
	resp, body, err := getLocal(url, 4<<20, "Envoy running, with its admin API at "+admin)
	if err != nil {
		return nil, fmt.Errorf("proxy-config log --reset: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("proxy-config log --reset: GET %s: %s", url, resp.Status)
	}
	var info struct {
		Options struct {
			LogLevel          string `json:"log_level"`
			ComponentLogLevel string `json:"component_log_level"`
		} `json:"command_line_options"`
	}
	if err := json.Unmarshal(body, &info); err != nil {
		return nil, fmt.Errorf("proxy-config log --reset: %s: %w", url, err)
	}
	level := cmp.Or(info.Options.LogLevel, "warning") // istioctl's default when it knows none
	queries, err := logLevelQueries(level)
	if err != nil {
		return nil, err
	}
	if c := info.Options.ComponentLogLevel; c != "" {
		more, err := logLevelQueries(c)
		if err != nil {
			return nil, err
		}
		queries = append(queries, more...)
	}
	return queries, nil
}

// postLogging is POST /logging?query at Envoy's admin: its answer, the
// loggers and their levels; an error with Envoy's own when it refuses.
func postLogging(admin, query string) ([]byte, error) {
	url := "http://" + admin + "/logging"
	if query != "" {
		url += "?" + query
	}
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Post(url, "", nil)
	if err != nil {
		return nil, fmt.Errorf("proxy-config log: %w (is Envoy running, with its admin API at %s?)", err, admin)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, fmt.Errorf("proxy-config log: reading %s: %w", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		first, _, _ := strings.Cut(string(body), "\n")
		return nil, fmt.Errorf("proxy-config log: Envoy refused %s: %s (%s)", query, first, resp.Status)
	}
	return body, nil
}

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
	return &cobra.Command{
		Use: "secret", Aliases: []string{"secrets", "s"}, Args: cobra.NoArgs,
		Short: "Envoy's secrets: type, status, serial number and validity (the agent's SDS secrets when Envoy holds none)",
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput("secret", common.output, "short", "json", "yaml"); err != nil {
				return err
			}
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
		},
	}
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
