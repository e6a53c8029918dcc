package conformance

// How the differential conformance suite compares two agents' output: the
// Envoy command line argument by argument, the bootstrap parsed as
// envoy.config.bootstrap.v3.Bootstrap on both sides and compared field by
// field, after the few normalizations below, minus the written-down list of
// fields allowed to differ (conformanceAllowed, also in docs/conformance.md). The
// typed_config types both bootstraps name are registered by the bootstrap package
// (services/envoy/bootstrap/types.go), which parses user templates the same way.

import (
	"encoding/json"
	"fmt"
	"path"
	"sort"
	"strconv"
	"strings"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"sigs.k8s.io/yaml"
)

// allowedDifference is a field of the bootstrap, or an argument of Envoy's
// command line, that may differ from Istio's, and why.
type allowedDifference struct {
	// path is a field path as diffBootstrap names it
	// (node.metadata.ISTIO_VERSION, static_resources.clusters[*].name);
	// "*" matches one key or index.
	path   string
	reason string
}

// conformanceAllowed is the whole list of differences from Istio's agent
// that the suite accepts. Each is a decision, written down in docs/conformance.md's
// table too; anything else that differs is a failure.
var conformanceAllowed = []allowedDifference{
	{"node.metadata.ISTIO_VERSION", "the version of the agent that wrote the bootstrap: meshagent's own build version (make build), where Istio's is Istio's release; ISTIO_META_ISTIO_VERSION still wins on both"},
	{"static_resources.clusters[*].max_requests_per_connection", "xds-grpc's one request per connection is set in HttpProtocolOptions.common_http_protocol_options, where Envoy reads it now, not in the Cluster field Envoy deprecated (same limit, no deprecation warning)"},
	{"static_resources.clusters[*].typed_extension_protocol_options.envoy.extensions.upstreams.http.v3.HttpProtocolOptions.common_http_protocol_options", "the other side of the max_requests_per_connection move"},
	// The :15021 listener's readiness route (#36): Envoy answers the kubelet's probe itself while
	// the agent has said it is ready (MESHAGENT_ENVOY_ANSWERS_READINESS, default true).
	{readinessRoutes + "[0].direct_response", readinessReason},
	{readinessRoutes + "[0].match.runtime_fraction", readinessReason},
	{readinessRoutes + "[0].route", readinessReason},
	{readinessRoutes + "[1]", readinessReason},
	{"exit_code", "bad input: meshagent exits 2 (a usage error) and names every bad value; Istio's pilot-agent exits 255 (os.Exit(-1)) for every error, and cobra's own errors exit 1 in meshagent"},
}

const (
	readinessRoutes = "static_resources.listeners[*].filter_chains[0].filters[0].typed_config.route_config.virtual_hosts[0].routes"
	readinessReason = "the :15021 listener answers /healthz/ready in Envoy while the runtime key meshagent.agent_ready is 100, which the agent sets while it is ready, and forwards it to the agent as Istio's does otherwise: the kubelet's probes no longer wake the agent (#36; MESHAGENT_ENVOY_ANSWERS_READINESS=false gives Istio's route alone)"
)

// allowedReason is the reason a difference at path is allowed, "" if it is not.
func allowedReason(p string) string {
	for _, a := range conformanceAllowed {
		if pathMatches(a.path, p) {
			return a.reason
		}
	}
	return ""
}

// pathMatches matches a field path against a pattern of the same shape in
// which "*" stands for one key or one index.
func pathMatches(pattern, p string) bool {
	ps, ss := splitFieldPath(pattern), splitFieldPath(p)
	if len(ps) != len(ss) {
		return false
	}
	for i := range ps {
		if ps[i] != "*" && ps[i] != ss[i] {
			return false
		}
	}
	return true
}

// splitFieldPath splits a.b[3].c into a, b, 3, c.
func splitFieldPath(p string) []string {
	p = strings.ReplaceAll(strings.ReplaceAll(p, "[", "."), "]", "")
	return strings.Split(p, ".")
}

// fieldDiff is one field that differs: its path and both values as JSON
// ("" when absent on that side).
type fieldDiff struct {
	Path   string `json:"path"`
	Istio  string `json:"istio,omitempty"`
	Ours   string `json:"ours,omitempty"`
	Reason string `json:"allowed,omitempty"` // set when the difference is on the allow-list
}

func (d fieldDiff) String() string {
	show := func(s string) string {
		if s == "" {
			return "(absent)"
		}
		if len(s) > 160 {
			return s[:157] + "..."
		}
		return s
	}
	return fmt.Sprintf("%s: istio %s, meshagent %s", d.Path, show(d.Istio), show(d.Ours))
}

// normalizer makes two agents' outputs comparable: each agent's working
// files live in its own directory (Istio's: paths relative to its working
// directory, ./etc/istio/proxy/XDS; ours: under --root, /tmp/x/etc/istio/proxy/XDS),
// and each was given its own path to the stand-in Envoy.
type normalizer struct {
	Root  string // the agent's --root or working directory
	envoy string // the stand-in Envoy's path as the agent was given it
}

// value normalizes one string: the Envoy binary becomes <envoy>, a path
// under the root or relative to it becomes relative and clean
// (etc/istio/proxy/XDS).
func (n normalizer) value(s string) string {
	if n.envoy != "" && s == n.envoy {
		return "<envoy>"
	}
	if n.Root != "" && strings.HasPrefix(s, n.Root+"/") {
		return path.Clean(s[len(n.Root)+1:])
	}
	if strings.HasPrefix(s, "./") {
		return path.Clean(s)
	}
	return s
}

// args normalizes a command line, and the JSON of --config-yaml inside it.
func (n normalizer) args(args []string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		out[i] = n.value(a)
	}
	return out
}

// parseRecordedBootstrap reads a bootstrap as Envoy does (JSON, or YAML
// when yamlText), into the Bootstrap proto; unknown fields are dropped, as
// Envoy drops them with --allow-unknown-static-fields.
func parseRecordedBootstrap(data []byte, yamlText bool) (*bootstrapv3.Bootstrap, error) {
	if yamlText {
		js, err := yaml.YAMLToJSON(data)
		if err != nil {
			return nil, err
		}
		data = js
	}
	b := &bootstrapv3.Bootstrap{}
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(data, b); err != nil {
		return nil, err
	}
	return b, nil
}

// bootstrapTree is the bootstrap as a generic JSON tree in protojson's
// canonical form (proto field names, every Any expanded), normalized.
func bootstrapTree(b *bootstrapv3.Bootstrap, n normalizer) (map[string]any, error) {
	js, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(b)
	if err != nil {
		return nil, err
	}
	var tree map[string]any
	if err := json.Unmarshal(js, &tree); err != nil {
		return nil, err
	}
	return normalizeTree(tree, n).(map[string]any), nil
}

// normalizeTree applies the normalizer to every string, and writes every
// udpa.type.v1.TypedStruct whose type Envoy knows as that type: Envoy reads
// both forms the same way (Istio's template writes the internal listener
// extension as a TypedStruct, meshagent as the type itself).
func normalizeTree(v any, n normalizer) any {
	switch v := v.(type) {
	case map[string]any:
		if v["@type"] == "type.googleapis.com/udpa.type.v1.TypedStruct" {
			if url, ok := v["type_url"].(string); ok && typedStructAsType[url] {
				out := map[string]any{"@type": url}
				if val, ok := v["value"].(map[string]any); ok {
					for k, x := range val {
						out[k] = x
					}
				}
				v = out
			}
		}
		out := make(map[string]any, len(v))
		for k, x := range v {
			out[k] = normalizeTree(x, n)
		}
		return out
	case []any:
		out := make([]any, len(v))
		for i, x := range v {
			out[i] = normalizeTree(x, n)
		}
		return out
	case string:
		return n.value(v)
	}
	return v
}

// typedStructAsType are the types a TypedStruct is compared as: those whose
// JSON form the TypedStruct's value already is (a number of a uint32 field
// stays a number in both).
var typedStructAsType = map[string]bool{
	"type.googleapis.com/envoy.extensions.bootstrap.internal_listener.v3.InternalListener": true,
}

// diffTrees lists every leaf that differs between Istio's tree and ours,
// by path; a list is compared index by index.
func diffTrees(istio, ours any, p string, out *[]fieldDiff) {
	switch iv := istio.(type) {
	case map[string]any:
		ov, ok := ours.(map[string]any)
		if !ok {
			break
		}
		keys := map[string]bool{}
		for k := range iv {
			keys[k] = true
		}
		for k := range ov {
			keys[k] = true
		}
		sorted := make([]string, 0, len(keys))
		for k := range keys {
			sorted = append(sorted, k)
		}
		sort.Strings(sorted)
		for _, k := range sorted {
			child := k
			if p != "" {
				child = p + "." + k
			}
			a, aok := iv[k]
			b, bok := ov[k]
			switch {
			case !aok:
				*out = append(*out, fieldDiff{Path: child, Ours: jsonText(b)})
			case !bok:
				*out = append(*out, fieldDiff{Path: child, Istio: jsonText(a)})
			default:
				diffTrees(a, b, child, out)
			}
		}
		return
	case []any:
		ov, ok := ours.([]any)
		if !ok {
			break
		}
		for i := range max(len(iv), len(ov)) {
			child := p + "[" + strconv.Itoa(i) + "]"
			switch {
			case i >= len(iv):
				*out = append(*out, fieldDiff{Path: child, Ours: jsonText(ov[i])})
			case i >= len(ov):
				*out = append(*out, fieldDiff{Path: child, Istio: jsonText(iv[i])})
			default:
				diffTrees(iv[i], ov[i], child, out)
			}
		}
		return
	default:
		if jsonText(istio) == jsonText(ours) {
			return
		}
	}
	*out = append(*out, fieldDiff{Path: p, Istio: jsonText(istio), Ours: jsonText(ours)})
}

func jsonText(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// comparison is the outcome of one case for one aspect (bootstrap, args, ...).
type comparison struct {
	diffs   []fieldDiff // not allowed
	allowed []fieldDiff // allowed, with the reason
}

func (c comparison) equal() bool { return len(c.diffs) == 0 }

// classify splits differences into allowed ones and the rest.
func classify(diffs []fieldDiff) comparison {
	var c comparison
	for _, d := range diffs {
		if r := allowedReason(d.Path); r != "" {
			d.Reason = r
			c.allowed = append(c.allowed, d)
			continue
		}
		c.diffs = append(c.diffs, d)
	}
	return c
}

// compareBootstraps parses both bootstraps and compares them field by field.
func compareBootstraps(istio, ours recordedBootstrap, in, on normalizer) (comparison, error) {
	ib, err := parseRecordedBootstrap(istio.data, istio.yaml)
	if err != nil {
		return comparison{}, fmt.Errorf("Istio's bootstrap: %w", err)
	}
	ob, err := parseRecordedBootstrap(ours.data, ours.yaml)
	if err != nil {
		return comparison{}, fmt.Errorf("meshagent's bootstrap: %w", err)
	}
	it, err := bootstrapTree(ib, in)
	if err != nil {
		return comparison{}, err
	}
	ot, err := bootstrapTree(ob, on)
	if err != nil {
		return comparison{}, err
	}
	var diffs []fieldDiff
	diffTrees(it, ot, "", &diffs)
	return classify(diffs), nil
}

// compareArgs compares Envoy's command lines argument by argument; the
// JSON of --config-yaml is compared as JSON.
func compareArgs(istio, ours []string, in, on normalizer) comparison {
	ia, oa := in.args(istio), on.args(ours)
	var diffs []fieldDiff
	for i := range max(len(ia), len(oa)) {
		p := "args[" + strconv.Itoa(i) + "]"
		switch {
		case i >= len(ia):
			diffs = append(diffs, fieldDiff{Path: p, Ours: strconv.Quote(oa[i])})
		case i >= len(oa):
			diffs = append(diffs, fieldDiff{Path: p, Istio: strconv.Quote(ia[i])})
		case ia[i] != oa[i] && !(i > 0 && ia[i-1] == "--config-yaml" && sameJSON(ia[i], oa[i])):
			diffs = append(diffs, fieldDiff{Path: p, Istio: strconv.Quote(ia[i]), Ours: strconv.Quote(oa[i])})
		}
	}
	return classify(diffs)
}

func sameJSON(a, b string) bool {
	var x, y any
	if json.Unmarshal([]byte(a), &x) != nil || json.Unmarshal([]byte(b), &y) != nil {
		return false
	}
	return jsonText(x) == jsonText(y)
}

// recordedBootstrap is a bootstrap file as the stand-in Envoy recorded it.
type recordedBootstrap struct {
	data []byte
	yaml bool
}
