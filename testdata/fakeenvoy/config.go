package main

import (
	"encoding/json"
	"fmt"
	"log"
	"os"
	"sort"
	"strings"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	// The typed configs the fake acts on; others are accepted unchecked.
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoregistry"
	"sigs.k8s.io/yaml"
)

// loadBootstrap reads the bootstrap file (JSON, or YAML by extension), merges
// --config-yaml over it as Envoy does, and validates the result.
func loadBootstrap(o *options) (*bootstrapv3.Bootstrap, error) {
	boot := &bootstrapv3.Bootstrap{}
	if o.configPath != "" {
		raw, err := os.ReadFile(o.configPath)
		if err != nil {
			return nil, err
		}
		isYAML := strings.HasSuffix(o.configPath, ".yaml") || strings.HasSuffix(o.configPath, ".yml")
		if err := unmarshalBootstrap(raw, isYAML, o.allowUnknownStatic, boot); err != nil {
			return nil, fmt.Errorf("%s: %w", o.configPath, err)
		}
	}
	if o.configYAML != "" {
		override := &bootstrapv3.Bootstrap{}
		if err := unmarshalBootstrap([]byte(o.configYAML), true, o.allowUnknownStatic, override); err != nil {
			return nil, fmt.Errorf("--config-yaml: %w", err)
		}
		proto.Merge(boot, override)
	}
	if err := boot.ValidateAll(); err != nil {
		return nil, fmt.Errorf("invalid bootstrap: %w", err)
	}
	if boot.GetAdmin().GetAddress().GetSocketAddress() == nil {
		return nil, fmt.Errorf("bootstrap has no admin socket_address")
	}
	return boot, nil
}

func unmarshalBootstrap(raw []byte, isYAML, allowUnknown bool, into *bootstrapv3.Bootstrap) error {
	if isYAML {
		var err error
		if raw, err = yaml.YAMLToJSON(raw); err != nil {
			return err
		}
	}
	raw, skipped, err := stubUnknownAnys(raw)
	if err != nil {
		return err
	}
	if len(skipped) > 0 {
		log.Printf("typed configs not checked by the fake: %s", strings.Join(skipped, ", "))
	}
	return protojson.UnmarshalOptions{DiscardUnknown: allowUnknown}.Unmarshal(raw, into)
}

// stubUnknownAnys replaces every typed config whose type the fake does not
// link in by an Empty, so that the rest of the bootstrap can still be
// checked. It returns the type URLs it replaced.
func stubUnknownAnys(raw []byte) ([]byte, []string, error) {
	var doc any
	if err := json.Unmarshal(raw, &doc); err != nil {
		return nil, nil, err
	}
	seen := map[string]bool{}
	var walk func(v any) any
	walk = func(v any) any {
		switch v := v.(type) {
		case map[string]any:
			if url, ok := v["@type"].(string); ok {
				if _, err := protoregistry.GlobalTypes.FindMessageByURL(url); err != nil {
					seen[url] = true
					return map[string]any{"@type": "type.googleapis.com/google.protobuf.Empty", "value": map[string]any{}}
				}
			}
			for k, e := range v {
				v[k] = walk(e)
			}
		case []any:
			for i, e := range v {
				v[i] = walk(e)
			}
		}
		return v
	}
	out, err := json.Marshal(walk(doc))
	skipped := make([]string, 0, len(seen))
	for u := range seen {
		skipped = append(skipped, u)
	}
	sort.Strings(skipped)
	return out, skipped, err
}

// staticCluster finds a static cluster by name.
func staticCluster(boot *bootstrapv3.Bootstrap, name string) *clusterv3.Cluster {
	for _, c := range boot.GetStaticResources().GetClusters() {
		if c.GetName() == name {
			return c
		}
	}
	return nil
}

// clusterAddress is the first endpoint address of a static cluster.
func clusterAddress(c *clusterv3.Cluster) *corev3.Address {
	for _, le := range c.GetLoadAssignment().GetEndpoints() {
		for _, lb := range le.GetLbEndpoints() {
			if a := lb.GetEndpoint().GetAddress(); a != nil {
				return a
			}
		}
	}
	return nil
}
