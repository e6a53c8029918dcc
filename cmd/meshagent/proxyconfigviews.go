package main

// istioctl's remaining proxy-config views, from inside the pod (#35):
// bootstrap and all here; log (Envoy's log levels through its admin POST
// /logging) in proxyconfiglog.go; rootca-compare and secret's fallback to
// the agent's own SDS secrets in proxyconfigsecret.go. Each reads Envoy
// through fetchConfigDump or getLocal and the agent through getStatusDoc,
// the commands' one way to ask the pod; log's POST is its own.

import (
	"bytes"
	"encoding/json"
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

// proxyConfigView is one view of proxy-config: it refuses an -o
// (*output) the view does not print, then runs.
func proxyConfigView(use string, aliases []string, short string, output *string, allowed []string,
	run func(cmd *cobra.Command) error) *cobra.Command {
	return &cobra.Command{
		Use: use, Aliases: aliases, Short: short, Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !slices.Contains(allowed, *output) {
				return usageError("proxy-config %s: -o %q: want %s", use, *output, strings.Join(allowed, ", "))
			}
			return run(cmd)
		},
	}
}

// newBootstrapView is istioctl's `proxy-config bootstrap`: the bootstrap
// dump as JSON (its default) or YAML, or the versions (-o short).
func newBootstrapView(common *proxyConfigFlags) *cobra.Command {
	var output string
	c := proxyConfigView("bootstrap", []string{"b"},
		"Envoy's bootstrap: node, static resources, admin (JSON by default, as istioctl)",
		&output, []string{"json", "yaml", "short"}, func(cmd *cobra.Command) error {
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
		})
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
	c := proxyConfigView("all", []string{"a"},
		"Everything: bootstrap, clusters, listeners, routes, secrets and endpoints (-o json: Envoy's whole config_dump)",
		&common.output, []string{"short", "json", "yaml"}, func(cmd *cobra.Command) error {
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
		})
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
