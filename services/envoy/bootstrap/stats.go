package bootstrap

import (
	"encoding/json"
	"slices"
	"strings"
	"time"

	"github.com/meshagent/meshagent/services/internal/unique"
)

// Pod annotations that tune the stats section (Istio's sidecar.istio.io/* names).
const (
	annoExtraStatTags     = "sidecar.istio.io/extraStatTags"
	annoInclusionPrefixes = "sidecar.istio.io/statsInclusionPrefixes"
	annoInclusionSuffixes = "sidecar.istio.io/statsInclusionSuffixes"
	annoInclusionRegexps  = "sidecar.istio.io/statsInclusionRegexps"
	annoHistogramBuckets  = "sidecar.istio.io/statsHistogramBuckets"
	annoStatsFlush        = "sidecar.istio.io/statsFlushInterval"
	annoStatsEviction     = "sidecar.istio.io/statsEvictionInterval"
)

// Stats Istio always keeps: the readiness check and drain logic read them.
var (
	requiredInclusionPrefixes = []string{"cluster_manager", "listener_manager", "server", "cluster.xds-grpc", "wasm"}
	rbacInclusionSuffixes     = []string{"rbac.allowed", "rbac.denied", "shadow_allowed", "shadow_denied"}
	requiredInclusionRegexps  = []string{`vhost\..*\.route\..*`}
)

// statsTag is one of Istio's tag extraction rules (name, regex).
type statsTag struct{ name, regex string }

// istioStatsTagsHead and istioStatsTagsTail surround the extra stat tags, in Istio's order. The
// cluster and HTTP connection manager names end with ';' (Istio names its clusters and stat
// prefixes so, since 1.24, so that a name may hold dots), and Envoy's watchdog stats carry the
// thread's name.
var (
	istioStatsTagsHead = []statsTag{
		{"cluster_name", `^cluster(\.(.+);)`},
		{"http_conn_manager_prefix", `^http\.(((?:[_.[:digit:]\w]*|[_\[\]aAbBcCdDeEfF[:digit:]\w\:]*));\.)`},
		{"thread_name", `^server(\.(.+))\.watchdog`},
		{"tcp_prefix", `^tcp\.((.*?)\.)\w+?$`},
		{"response_code", `_rq(_(\d{3}))$`},
		{"response_code_class", `_rq(_(\dxx))$`},
		{"http_conn_manager_listener_prefix", `^listener(?=\.).*?\.http\.(((?:[_.[:digit:]]*|[_\[\]aAbBcCdDeEfF[:digit:]]*))\.)`},
		{"listener_address", `^listener\.(((?:[_.[:digit:]]*|[_\[\]aAbBcCdDeEfF[:digit:]]*))\.)`},
		{"mongo_prefix", `^mongo\.(.+?)\.(collection|cmd|cx_|op_|delays_|decoding_)(.*?)$`},
	}
	istioStatsTagsTail = []statsTag{
		{"cache", `(cache\.(.+?)\.)`},
		{"component", `(component\.(.+?)\.)`},
		{"tag", `(tag\.(.+?);\.)`},
		{"wasm_filter", `(wasm_filter\.(.+?)\.)`},
		{"authz_enforce_result", `rbac(\.(allowed|denied))`},
		{"authz_dry_run_action", `(\.istio_dry_run_(allow|deny)_)`},
		{"authz_dry_run_result", `(\.shadow_(allowed|denied))`},
	}
)

// histogramBucket is one sidecar.istio.io/statsHistogramBuckets entry: Envoy's
// HistogramBucketSettings in proto JSON, which is also how Istio's templates see it.
type histogramBucket struct {
	Match   histogramMatch `json:"match"`
	Buckets []float64      `json:"buckets"`
}

type histogramMatch struct {
	Prefix string `json:"prefix"`
}

// statsOptions are the stats choices derived from ProxyConfig, annotations and environment.
type statsOptions struct {
	extraTags                  []string
	prefixes, suffixes, regexp []string
	buckets                    []histogramBucket
	compression                bool
	// flushInterval and evictionInterval are set only by their annotations (Envoy's default
	// flush is 5s); 0: not set.
	flushInterval, evictionInterval time.Duration
}

func getStatsOptions(c Config, node nodeInfo) statsOptions {
	pc := c.Proxy
	anno := node.annotations
	// An annotation replaces the ProxyConfig list (never merged); the required entries are appended and
	// {pod_ip} expands to each instance IP.
	parse := func(annotation string, fromProxy, required []string) []string {
		var list []string
		if v := anno[annotation]; v != "" {
			list = strings.Split(v, ",")
		} else {
			list = slices.Clone(fromProxy)
		}
		list = append(list, required...)
		out := make([]string, 0, len(list))
		for _, p := range list {
			if !strings.Contains(p, "{pod_ip}") {
				out = append(out, p)
				continue
			}
			for _, ip := range unique.Values(c.InstanceIPs) {
				out = append(out, strings.ReplaceAll(p, "{pod_ip}", ip))
			}
		}
		return out
	}
	suffixes := rbacInclusionSuffixes
	if c.ExitOnZeroActiveConnections {
		suffixes = append(slices.Clone(suffixes), "downstream_cx_active")
	}
	m := pc.GetProxyStatsMatcher()
	o := statsOptions{
		prefixes:    parse(annoInclusionPrefixes, m.GetInclusionPrefixes(), requiredInclusionPrefixes),
		suffixes:    parse(annoInclusionSuffixes, m.GetInclusionSuffixes(), suffixes),
		regexp:      parse(annoInclusionRegexps, m.GetInclusionRegexps(), requiredInclusionRegexps),
		compression: pc.GetStatsCompression() == nil || pc.GetStatsCompression().GetValue(),
	}
	for _, t := range append(slices.Clone(pc.GetExtraStatTags()), strings.Split(anno[annoExtraStatTags], ",")...) {
		if t != "" && !slices.Contains(o.extraTags, t) {
			o.extraTags = append(o.extraTags, t)
		}
	}
	// Istio checks the eviction interval against the flush interval, 5s unless annotated, and
	// drops one that is not a multiple of it.
	flush := 5 * time.Second
	if v, ok := anno[annoStatsFlush]; ok {
		if d, err := time.ParseDuration(v); err == nil {
			flush, o.flushInterval = d, d
		}
	}
	if v, ok := anno[annoStatsEviction]; ok {
		if d, err := time.ParseDuration(v); err == nil && flush != 0 && d%flush == 0 {
			o.evictionInterval = d.Truncate(time.Second) // whole seconds, as Istio writes it
		}
	}
	// Histogram buckets: a JSON object prefix → bounds; ignored if it does not parse (as in Istio).
	var js map[string][]float64
	if json.Unmarshal([]byte(anno[annoHistogramBuckets]), &js) == nil {
		prefixes := make([]string, 0, len(js))
		for p := range js {
			prefixes = append(prefixes, p)
		}
		slices.Sort(prefixes)
		for _, p := range prefixes {
			o.buckets = append(o.buckets, histogramBucket{Match: histogramMatch{Prefix: p}, Buckets: js[p]})
		}
	}
	return o
}

// statsConfig is Istio's stats_config: its tag extraction rules and an inclusion list.
func statsConfig(o statsOptions, metadataDiscovery bool) object {
	var tags []object
	add := func(t statsTag) {
		tags = append(tags, object{"tag_name": t.name, "regex": t.regex})
	}
	for _, t := range istioStatsTagsHead {
		add(t)
	}
	for _, name := range o.extraTags {
		add(statsTag{name, `(` + name + `=\.=(.*?);\.;)`})
	}
	for _, t := range istioStatsTagsTail {
		add(t)
	}

	patterns := []object{prefixMatcher("reporter=")}
	if metadataDiscovery {
		patterns = append(patterns, prefixMatcher("workload_discovery"))
	}
	for _, p := range o.prefixes {
		patterns = append(patterns, prefixMatcher(p))
	}
	for _, s := range o.suffixes {
		patterns = append(patterns, object{"suffix": s})
	}
	for _, r := range o.regexp {
		patterns = append(patterns, object{"safe_regex": object{"regex": r}})
	}
	patterns = append(patterns, prefixMatcher("component"), prefixMatcher("istio"))

	cfg := object{
		"stats_tags":           tags,
		"use_all_default_tags": false,
		"stats_matcher":        object{"inclusion_list": object{"patterns": patterns}},
	}
	if len(o.buckets) > 0 {
		cfg["histogram_bucket_settings"] = o.buckets
	}
	return cfg
}

// statsFlush is stats_flush_interval, nil unless annotated. Istio's template writes Go's form of
// the duration, which Envoy cannot read unless it is in whole seconds ("1m" becomes "1m0s"); this
// writes any duration as Envoy reads it.
func statsFlush(o statsOptions) json.RawMessage {
	if o.flushInterval <= 0 {
		return nil
	}
	return duration(o.flushInterval)
}

// statsEviction is stats_eviction_interval, nil unless annotated (and a multiple of the flush interval).
func statsEviction(o statsOptions) json.RawMessage {
	if o.evictionInterval <= 0 {
		return nil
	}
	return duration(o.evictionInterval)
}

func prefixMatcher(p string) object {
	return object{"prefix": p}
}
