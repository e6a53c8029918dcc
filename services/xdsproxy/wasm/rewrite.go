package wasm

import (
	"context"
	"fmt"
	"strings"
	"sync"

	udpa "github.com/cncf/xds/go/udpa/type/v1"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rbacv3 "github.com/envoyproxy/go-control-plane/envoy/config/rbac/v3"
	httprbac "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rbac/v3"
	httpwasm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/wasm/v3"
	netrbac "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/rbac/v3"
	netwasm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/wasm/v3"
	wasmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/wasm/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// The types istiod sends a WasmPlugin as (pkg/model/wasm.go), and the
// variables it adds to the VM's environment for the agent alone.
const (
	typePrefix      = "type.googleapis.com/"
	httpWasmType    = typePrefix + "envoy.extensions.filters.http.wasm.v3.Wasm"
	networkWasmType = typePrefix + "envoy.extensions.filters.network.wasm.v3.Wasm"
	typedStructType = typePrefix + "udpa.type.v1.TypedStruct"

	pullSecretEnv      = "ISTIO_META_WASM_IMAGE_PULL_SECRET"
	pullPolicyEnv      = "ISTIO_META_WASM_IMAGE_PULL_POLICY"
	resourceVersionEnv = "ISTIO_META_WASM_PLUGIN_RESOURCE_VERSION"
	// istioMetaPrefix: every such variable is the agent's, stripped before
	// Envoy sees the VM's environment.
	istioMetaPrefix = "ISTIO_META_"

	// The stat prefixes of Istio's stand-in RBAC filters.
	allowStatPrefix = "wasm-default-allow"
	denyStatPrefix  = "wasm-default-deny"
)

var pullPolicies = map[string]PullPolicy{"UNSPECIFIED_POLICY": PullUnspecified, "IfNotPresent": PullIfNotPresent, "Always": PullAlways}

// RewriteAll rewrites the ECDS resources in place, each on its own
// goroutine, as Istio's MaybeConvertWasmExtensionConfig. A resource that
// is not a TypedExtensionConfig, or a Wasm filter with neither remote nor
// local code, makes an error, for which the response is NACKed upstream
// (Istio's behaviour); a module that cannot be fetched does not: the
// resource becomes Istio's stand-in filter (Rewrite).
func (c *Cache) RewriteAll(ctx context.Context, resources []*anypb.Any) error {
	start := c.clock.Now()
	defer func() { c.m.duration.Observe(float64(c.clock.Now().Sub(start).Milliseconds())) }()
	errs := make([]error, len(resources))
	var wg sync.WaitGroup
	for i, r := range resources {
		wg.Go(func() {
			out, err := c.Rewrite(ctx, r)
			if err != nil {
				errs[i] = err
				return
			}
			resources[i] = out
		})
	}
	wg.Wait()
	var msgs []string
	for _, err := range errs {
		if err != nil {
			msgs = append(msgs, err.Error())
		}
	}
	if len(msgs) > 0 {
		return fmt.Errorf("%d error(s) occurred:\n\t* %s", len(msgs), strings.Join(msgs, "\n\t* "))
	}
	return nil
}

// Rewrite returns the ECDS resource res with its Wasm code made local: res
// itself when it is not a Wasm filter with remote code; the filter with
// vm_config.code.local.filename the cached module when the fetch works;
// else, by the plugin's failure policy (failure_policy, or the deprecated
// fail_open), Istio's stand-in: an RBAC filter of the same name allowing
// everything (fail open: the plugin is left out) or denying everything
// (fail closed).
func (c *Cache) Rewrite(ctx context.Context, res *anypb.Any) (*anypb.Any, error) {
	out, result, err := c.rewrite(ctx, res)
	c.m.conversions.WithLabelValues(result).Inc()
	return out, err
}

// rewrite is Rewrite, and the result it counts (Istio's
// wasm_config_conversion_count).
func (c *Cache) rewrite(ctx context.Context, res *anypb.Any) (*anypb.Any, string, error) {
	ec := new(corev3.TypedExtensionConfig)
	if err := res.UnmarshalTo(ec); err != nil {
		return nil, unmarshalFailure, fmt.Errorf("failed to unmarshal extension config resource: %w", err)
	}
	tc := ec.GetTypedConfig()
	if tc == nil {
		return nil, unmarshalFailure, fmt.Errorf("typed extension config %s does not contain any typed config", ec.GetName())
	}
	var filter *filterConfig
	switch tc.GetTypeUrl() {
	case httpWasmType, networkWasmType:
		filter = newFilter(tc.GetTypeUrl())
		if err := tc.UnmarshalTo(filter.wasm); err != nil {
			return nil, unmarshalFailure, fmt.Errorf("failed to unmarshal extension config resource into Wasm filter: %w", err)
		}
	case typedStructType:
		ts := new(udpa.TypedStruct)
		if err := tc.UnmarshalTo(ts); err != nil {
			return nil, unmarshalFailure, fmt.Errorf("failed to unmarshal typed config for wasm filter: %w", err)
		}
		if filter = newFilter(ts.GetTypeUrl()); filter == nil {
			return res, noRemoteLoad, nil
		}
		js, err := protojson.Marshal(ts.GetValue())
		if err == nil {
			err = protojson.Unmarshal(js, filter.wasm)
		}
		if err != nil {
			return nil, unmarshalFailure, fmt.Errorf("failed to convert extension config %s's struct to a Wasm filter: %w", ec.GetName(), err)
		}
	default:
		return res, noRemoteLoad, nil
	}
	plugin := filter.wasm.GetConfig()
	code := plugin.GetVmConfig().GetCode()
	if code.GetRemote() == nil {
		if code.GetLocal() == nil {
			return nil, unmarshalFailure, fmt.Errorf("no remote and local load found in Wasm filter %s", ec.GetName())
		}
		return res, noRemoteLoad, nil
	}

	if result, err := c.localize(ctx, ec.GetName(), plugin); err != nil {
		failOpen := failsOpen(plugin)
		c.log.Error("cannot fetch a Wasm module; serving Istio's stand-in RBAC filter", "resource", ec.GetName(),
			"fail_open", failOpen, "error", err)
		return mustAny(&corev3.TypedExtensionConfig{Name: ec.GetName(), TypedConfig: filter.standIn(failOpen)}), result, nil
	}
	wasmAny, err := anypb.New(filter.wasm)
	if err != nil {
		return nil, marshalFailure, fmt.Errorf("failed to marshal new wasm filter: %w", err)
	}
	ec.TypedConfig = wasmAny
	out, err := anypb.New(ec)
	if err != nil {
		return nil, marshalFailure, fmt.Errorf("failed to marshal new extension config resource: %w", err)
	}
	return out, conversionSuccess, nil
}

// localize fetches the plugin's module and points its VM at the file;
// the agent's variables leave the VM's environment either way. A failure
// comes with its result for wasm_config_conversion_count.
func (c *Cache) localize(ctx context.Context, resourceName string, plugin *wasmv3.PluginConfig) (string, error) {
	vm := plugin.GetVmConfig()
	o := GetOptions{ResourceName: resourceName}
	if env := vm.GetEnvironmentVariables(); env != nil {
		kv := env.GetKeyValues()
		if sec, ok := kv[pullSecretEnv]; ok {
			if sec == "" {
				return fetchFailure, fmt.Errorf("cannot fetch Wasm module %v: missing image pulling secret", plugin.GetName())
			}
			o.PullSecret = []byte(sec)
		}
		o.PullPolicy = pullPolicies[kv[pullPolicyEnv]]
		o.ResourceVersion = kv[resourceVersionEnv]
		for k := range kv {
			if strings.HasPrefix(k, istioMetaPrefix) {
				delete(kv, k)
			}
		}
		if len(kv) == 0 {
			if len(env.GetHostEnvKeys()) == 0 {
				vm.EnvironmentVariables = nil
			} else {
				env.KeyValues = nil
			}
		}
	}
	remote := vm.GetCode().GetRemote()
	uri := remote.GetHttpUri()
	if uri == nil {
		return missRemoteFetchHint, fmt.Errorf("wasm remote fetch does not have httpUri specified for config %s", plugin.GetName())
	}
	// istiod sends "nil" for a WasmPlugin without a sha256.
	if remote.GetSha256() == "nil" {
		remote.Sha256 = ""
	}
	o.Checksum = remote.GetSha256()
	if t := uri.GetTimeout(); t != nil {
		o.Timeout = t.AsDuration()
	}
	path, err := c.Get(ctx, uri.GetUri(), o)
	if err != nil {
		return fetchFailure, fmt.Errorf("cannot fetch Wasm module %v: %w", uri.GetUri(), err)
	}
	vm.Code = &corev3.AsyncDataSource{Specifier: &corev3.AsyncDataSource_Local{
		Local: &corev3.DataSource{Specifier: &corev3.DataSource_Filename{Filename: path}},
	}}
	return conversionSuccess, nil
}

// failsOpen is the plugin's failure policy; unspecified, the deprecated
// fail_open.
func failsOpen(p *wasmv3.PluginConfig) bool {
	if fp := p.GetFailurePolicy(); fp != wasmv3.FailurePolicy_UNSPECIFIED {
		return fp == wasmv3.FailurePolicy_FAIL_OPEN
	}
	return p.GetFailOpen() //nolint:staticcheck // Istio reads it still
}

// filterConfig is an HTTP or a network Wasm filter, and Istio's RBAC
// filters of the same kind that stand in for it when its module cannot be
// had: no rules allow everything, empty rules deny everything. The two
// kinds differ only in these messages.
type filterConfig struct {
	wasm interface {
		proto.Message
		GetConfig() *wasmv3.PluginConfig
	}
	allow, deny proto.Message
}

// newFilter is the filter of a Wasm type URL; nil for any other.
func newFilter(typeURL string) *filterConfig {
	switch typeURL {
	case httpWasmType:
		return &filterConfig{wasm: new(httpwasm.Wasm),
			allow: &httprbac.RBAC{RulesStatPrefix: allowStatPrefix},
			deny:  &httprbac.RBAC{Rules: &rbacv3.RBAC{}, RulesStatPrefix: denyStatPrefix}}
	case networkWasmType:
		return &filterConfig{wasm: new(netwasm.Wasm),
			allow: &netrbac.RBAC{StatPrefix: allowStatPrefix},
			deny:  &netrbac.RBAC{Rules: &rbacv3.RBAC{}, StatPrefix: denyStatPrefix}}
	}
	return nil
}

// standIn is the RBAC filter for the plugin's failure policy.
func (f *filterConfig) standIn(failOpen bool) *anypb.Any {
	if failOpen {
		return mustAny(f.allow)
	}
	return mustAny(f.deny)
}

func mustAny(m proto.Message) *anypb.Any {
	a, err := anypb.New(m)
	if err != nil {
		panic(err) // a generated message always marshals
	}
	return a
}
