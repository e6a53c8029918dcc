package main

// `meshagent proxy-config cluster|listener|route|endpoint|secret` (issue
// 22; bootstrap, all, log and rootca-compare: proxyconfigviews.go,
// proxyconfiglog.go, proxyconfigsecret.go, #35):
// istioctl's tables read from inside the pod, from Envoy's admin
// /config_dump, so that they work without istiod or kubectl, and while
// the control plane is down.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/encoding/protojson"
	"sigs.k8s.io/yaml"

	"github.com/meshagent/meshagent/cmd/meshagent/envoyadmin"
)

// proxyConfigFlags are the flags every proxy-config view takes: Envoy's
// admin, the agent's status server (what the agent serves, #35) and the
// output.
type proxyConfigFlags struct {
	admin, status, output string
}

func newProxyConfigCommand() *cobra.Command {
	var common proxyConfigFlags
	cmd := &cobra.Command{
		Use:     "proxy-config",
		Aliases: []string{"pc"},
		Short:   "Shows Envoy's bootstrap, clusters, listeners, routes, endpoints, secrets or log levels as istioctl proxy-config does, from inside the pod",
		Example: "  meshagent proxy-config cluster --fqdn reviews.default.svc.cluster.local\n" +
			"  meshagent proxy-config listener --port 9080 -o yaml\n" +
			"  meshagent proxy-config log --level http:debug\n" +
			"  kubectl exec POD -c istio-proxy -- pilot-agent proxy-config secret",
		// A name that is no view is an error naming the views (#35);
		// cobra alone would print the help and exit 0.
		Args: cobra.ArbitraryArgs,
		RunE: unknownView,
	}
	cmd.PersistentFlags().StringVar(&common.admin, "admin", "localhost:15000", "Envoy's admin address (host:port)")
	cmd.PersistentFlags().StringVar(&common.status, "status-addr", "localhost:15020", "the agent's status server (host:port): secret, rootca-compare")
	cmd.PersistentFlags().StringVarP(&common.output, "output", "o", "short", "short (a table), json or yaml")

	var cf envoyadmin.ClusterFilter
	cluster := proxyConfigTable(&common, "cluster", []string{"clusters", "c"}, "Envoy's clusters: service, port, subset, direction, type, destination rule",
		false, func(d *envoyadmin.Dump) envoyadmin.Table { return d.ClusterTable(cf) })
	cluster.Flags().StringVar(&cf.FQDN, "fqdn", "", "only clusters whose name holds this service FQDN")
	cluster.Flags().IntVar(&cf.Port, "port", 0, "only clusters of this port")
	cluster.Flags().StringVar(&cf.Direction, "direction", "", "only clusters of this direction (inbound or outbound)")
	cluster.Flags().StringVar(&cf.Subset, "subset", "", "only clusters of this subset")

	var lf envoyadmin.ListenerFilter
	listener := proxyConfigTable(&common, "listener", []string{"listeners", "l"}, "Envoy's listeners: one line per filter chain, what it matches and where it sends",
		false, func(d *envoyadmin.Dump) envoyadmin.Table { return d.ListenerTable(lf) })
	listener.Flags().StringVar(&lf.Address, "address", "", "only listeners on this address")
	listener.Flags().IntVar(&lf.Port, "port", 0, "only listeners on this port")

	var rf envoyadmin.RouteFilter
	route := proxyConfigTable(&common, "route", []string{"routes", "r"}, "Envoy's routes: one line per route of each virtual host",
		false, func(d *envoyadmin.Dump) envoyadmin.Table { return d.RouteTable(rf) })
	route.Flags().StringVar(&rf.Name, "name", "", "only the route configuration of this name")

	var ef envoyadmin.EndpointFilter
	endpoint := proxyConfigTable(&common, "endpoint", []string{"endpoints", "ep"}, "Envoy's endpoints, per cluster",
		true, func(d *envoyadmin.Dump) envoyadmin.Table { return d.EndpointTable(ef) })
	endpoint.Flags().StringVar(&ef.Address, "address", "", "only endpoints of this address")
	endpoint.Flags().IntVar(&ef.Port, "port", 0, "only endpoints of this port")
	endpoint.Flags().StringVar(&ef.Cluster, "cluster", "", "only endpoints of this cluster")
	endpoint.Flags().StringVar(&ef.Status, "status", "", "only endpoints of this health status (HEALTHY, UNHEALTHY, ...)")

	cmd.AddCommand(cluster, listener, route, endpoint, newSecretView(&common),
		newBootstrapView(&common), newAllView(&common), newLogView(&common), newRootCACompareView(&common))
	return cmd
}

// proxyConfigTable is the sub-command printing one table of the dump;
// withEDS asks Envoy for its endpoints too.
func proxyConfigTable(common *proxyConfigFlags, use string, aliases []string, short string, withEDS bool,
	table func(*envoyadmin.Dump) envoyadmin.Table) *cobra.Command {
	return proxyConfigView(use, aliases, short, &common.output, []string{"short", "json", "yaml"}, func(cmd *cobra.Command) error {
		dump, err := fetchConfigDump(common.admin, withEDS)
		if err != nil {
			return fmt.Errorf("proxy-config %s: %w", use, err)
		}
		return writeProxyConfig(cmd.OutOrStdout(), table(dump), common.output)
	})
}

// maxConfigDump bounds Envoy's /config_dump as proxy-config reads it: a
// large mesh's dump runs to tens of MiB, and decoding one costs a few times
// its size (#33: with 256 MiB, proxy-config peaked at 0.84-1.32 GB).
const maxConfigDump = 64 << 20

// fetchConfigDump reads and decodes Envoy's /config_dump at admin.
func fetchConfigDump(admin string, withEDS bool) (*envoyadmin.Dump, error) {
	url := "http://" + admin + "/config_dump"
	if withEDS {
		url += "?include_eds"
	}
	resp, body, err := getLocal(url, maxConfigDump, "Envoy running, with its admin API at "+admin)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return envoyadmin.Decode(body)
}

// writeProxyConfig prints the table, or its resources as a JSON array or
// YAML list (what istioctl -o json|yaml prints).
func writeProxyConfig(w io.Writer, t envoyadmin.Table, output string) error {
	if output == "short" {
		tw := tabwriter.NewWriter(w, 0, 8, 5, ' ', 0)
		fmt.Fprintln(tw, strings.Join(t.Header, "\t"))
		for _, row := range t.Rows {
			fmt.Fprintln(tw, strings.Join(row, "\t"))
		}
		return tw.Flush()
	}
	list := make([]json.RawMessage, 0, len(t.Resources))
	for _, r := range t.Resources {
		b, err := protojson.MarshalOptions{Resolver: envoyadmin.Resolver}.Marshal(r)
		if err != nil {
			return err
		}
		list = append(list, b)
	}
	out, err := json.MarshalIndent(list, "", "    ")
	if err != nil {
		return err
	}
	return writeDocument(w, out, output)
}

// writeDocument prints a JSON document as it is (-o json) or as YAML.
func writeDocument(w io.Writer, js []byte, output string) error {
	if output == "yaml" {
		var err error
		if js, err = yaml.JSONToYAML(js); err != nil {
			return err
		}
	}
	_, err := fmt.Fprintln(w, string(bytes.TrimSpace(js)))
	return err
}
