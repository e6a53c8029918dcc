package config

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/meshagent/meshagent/services/envoy/bootstrap"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/wrapperspb"
	meshconfig "istio.io/api/mesh/v1alpha1"
	"sigs.k8s.io/yaml"
)

// Annotation keys Istio's agent reads from the pod's annotations file.
const (
	annotationProxyConfig      = "proxy.istio.io/config"
	annotationDiscoveryAddress = "sidecar.istio.io/discoveryAddress"
	annotationStatusPort       = "status.sidecar.istio.io/port"
)

// proxyConfigSources are the layers of the ProxyConfig, lowest first.
type proxyConfigSources struct {
	// injected is the layer a pod's injector would give the agent in its
	// mesh config: `standalone` wires the agent to its embedded peers
	// with it. Everything the user gives lies above it. Empty for `proxy`.
	injected       string
	meshConfigFile string // --meshConfig, under --root
	// meshConfigFlag is --meshConfig as given, nil when not: only Istio's
	// default file may be missing (Istio ignores a missing one whatever
	// its name, which hid a typo in the path; #21).
	meshConfigFlag  *string
	proxyConfigEnv  string // PROXY_CONFIG
	annotationsFile string // ./etc/istio/pod/annotations, under --root
}

// effectiveProxyConfig is the ProxyConfig the agent runs with, read from
// its sources as they are now: layered, its concurrency settled, checked.
// The start and a hot restart's Reload both take it from here.
func effectiveProxyConfig(r envReader, src proxyConfigSources, legacyConcurrency *int, log *slog.Logger) (*meshconfig.ProxyConfig, error) {
	pc, err := loadProxyConfig(src, log)
	if err != nil {
		return nil, err
	}
	applyConcurrency(pc, get(r, envIstioCPULimit), legacyConcurrency, log)
	if err := validateProxyConfig(pc); err != nil {
		return nil, fmt.Errorf("invalid proxy configuration: %w", err)
	}
	return pc, nil
}

// loadProxyConfig builds the ProxyConfig as Istio's agent does: defaults,
// (standalone's injected layer,) then the mesh config file's defaultConfig,
// then PROXY_CONFIG, then the proxy.istio.io/config annotation, then the
// discoveryAddress and status port annotations. Every error names the layer
// it came from.
func loadProxyConfig(src proxyConfigSources, log *slog.Logger) (*meshconfig.ProxyConfig, error) {
	pc := defaultProxyConfig()
	if src.injected != "" {
		var err error
		if pc, err = overlayProxyConfig(pc, []byte(src.injected), "meshagent standalone's settings", log); err != nil {
			return nil, err
		}
	}

	if data, err := readConfigFile(src.meshConfigFile); err == nil {
		var mesh map[string]json.RawMessage
		js, err := yaml.YAMLToJSON(data)
		if err == nil {
			err = json.Unmarshal(js, &mesh)
		}
		if err != nil {
			return nil, fmt.Errorf("mesh config file %s: %w", src.meshConfigFile, err)
		}
		if dc, ok := mesh["defaultConfig"]; ok {
			if pc, err = overlayProxyConfig(pc, dc, "defaultConfig of mesh config file "+src.meshConfigFile, log); err != nil {
				return nil, err
			}
		}
	} else if errors.Is(err, fs.ErrNotExist) && src.meshConfigFlag != nil {
		// --root is a prefix of every agent path (docs/reference.md), an
		// absolute --meshConfig too: said here, where a user who meant the
		// path as given finds out (#32).
		under := ""
		if filepath.IsAbs(*src.meshConfigFlag) && filepath.Clean(*src.meshConfigFlag) != src.meshConfigFile {
			under = " (--meshConfig is a path under --root, as every agent path, even when absolute)"
		}
		return nil, fmt.Errorf("--meshConfig %s: mesh config file %s does not exist%s", quoteValue(*src.meshConfigFlag), src.meshConfigFile, under)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("mesh config file: %w", err)
	}

	if src.proxyConfigEnv != "" {
		var err error
		if pc, err = overlayProxyConfig(pc, []byte(src.proxyConfigEnv), "PROXY_CONFIG", log); err != nil {
			return nil, err
		}
	}

	annotations, err := bootstrap.ReadDownwardAPI(src.annotationsFile)
	if err != nil {
		return nil, err
	}
	if v, ok := annotations[annotationProxyConfig]; ok {
		if pc, err = overlayProxyConfig(pc, []byte(v), "annotation "+annotationProxyConfig, log); err != nil {
			return nil, err
		}
	}
	if v, ok := annotations[annotationDiscoveryAddress]; ok {
		pc.DiscoveryAddress = v
	}
	if v, ok := annotations[annotationStatusPort]; ok {
		port, err := strconv.ParseUint(v, 10, 16)
		if err != nil {
			return nil, fmt.Errorf("annotation %s=%q in %s: not a port", annotationStatusPort, v, src.annotationsFile)
		}
		pc.StatusPort = int32(port)
	}
	return pc, nil
}

// overlayProxyConfig lays YAML or JSON over pc: fields present in the
// overlay replace those of pc (an explicit 0 or "" included, so that
// statusPort: 0 can turn the status server off), objects merge, lists are
// replaced. proxyMetadata merges key by key, as in Istio. Unknown fields
// are tolerated with a warning, as Istio's agent tolerates them.
func overlayProxyConfig(pc *meshconfig.ProxyConfig, overlay []byte, source string, log *slog.Logger) (*meshconfig.ProxyConfig, error) {
	js, err := yaml.YAMLToJSON(overlay)
	if err != nil {
		return nil, fmt.Errorf("%s: not YAML or JSON: %w", source, err)
	}
	var top map[string]any
	if err := json.Unmarshal(js, &top); err != nil {
		return nil, fmt.Errorf("%s: want a ProxyConfig object: %w", source, err)
	}
	if top == nil {
		return pc, nil
	}
	unknown := normalizeKeys(top, pc.ProtoReflect().Descriptor(), "")
	if len(unknown) > 0 {
		log.Warn("ignoring unknown ProxyConfig fields", "source", source, "fields", unknown)
	}
	base, err := protoObject(pc)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", source, err)
	}
	merged, err := json.Marshal(mergeJSON(base, top, pc.ProtoReflect().Descriptor()))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", source, err)
	}
	next := &meshconfig.ProxyConfig{}
	if err := protojson.Unmarshal(merged, next); err != nil {
		return nil, fmt.Errorf("%s: invalid ProxyConfig: %w", source, err)
	}
	return next, nil
}

// protoObject is m as the JSON object protojson writes (lowerCamelCase
// keys, unset fields left out): what an overlay merges into, and how the
// effective configuration shows a proto.
func protoObject(m proto.Message) (map[string]any, error) {
	js, err := protojson.Marshal(m)
	if err != nil {
		return nil, err
	}
	var obj map[string]any
	err = json.Unmarshal(js, &obj)
	return obj, err
}

// normalizeKeys renames every field key of obj to its protojson name (so
// that snake_case and lowerCamelCase inputs merge) and drops, returning,
// the keys that are not fields of md.
func normalizeKeys(obj map[string]any, md protoreflect.MessageDescriptor, prefix string) []string {
	var unknown []string
	fields := md.Fields()
	for key, val := range obj {
		fd := fields.ByJSONName(key)
		if fd == nil {
			fd = fields.ByTextName(key)
		}
		if fd == nil {
			unknown = append(unknown, prefix+key)
			delete(obj, key)
			continue
		}
		if name := fd.JSONName(); name != key {
			delete(obj, key)
			obj[name] = val
		}
		if fd.Kind() != protoreflect.MessageKind || fd.IsMap() || isWellKnown(fd.Message()) {
			continue
		}
		switch v := val.(type) {
		case map[string]any:
			unknown = append(unknown, normalizeKeys(v, fd.Message(), prefix+fd.JSONName()+".")...)
		case []any:
			for _, e := range v {
				if m, ok := e.(map[string]any); ok {
					unknown = append(unknown, normalizeKeys(m, fd.Message(), prefix+fd.JSONName()+".")...)
				}
			}
		}
	}
	return unknown
}

// isWellKnown reports messages that protojson writes as scalars (Duration,
// wrappers) or free-form JSON (Struct): their keys are not fields.
func isWellKnown(md protoreflect.MessageDescriptor) bool {
	return strings.HasPrefix(string(md.FullName()), "google.protobuf.")
}

// mergeJSON lays over onto base: objects merge recursively, everything else
// (scalars, lists, null) replaces. A field of a oneof replaces the field of
// the same oneof that base had (tracingServiceName over serviceCluster,
// tracing.datadog over tracing.zipkin), as it does in Istio's proto merge.
func mergeJSON(base, over map[string]any, md protoreflect.MessageDescriptor) map[string]any {
	fields := md.Fields()
	for k, v := range over {
		fd := fields.ByJSONName(k)
		if fd == nil {
			base[k] = v
			continue
		}
		if oneof := fd.ContainingOneof(); oneof != nil && !oneof.IsSynthetic() {
			for i := range oneof.Fields().Len() {
				if other := oneof.Fields().Get(i); other != fd {
					delete(base, other.JSONName())
				}
			}
		}
		if vm, ok := v.(map[string]any); ok && fd.Kind() == protoreflect.MessageKind && !fd.IsMap() && !isWellKnown(fd.Message()) {
			if bm, ok := base[k].(map[string]any); ok {
				base[k] = mergeJSON(bm, vm, fd.Message())
				continue
			}
		}
		if vm, ok := v.(map[string]any); ok && fd.IsMap() {
			// proxyMetadata, runtimeValues: key by key.
			if bm, ok := base[k].(map[string]any); ok {
				for mk, mv := range vm {
					bm[mk] = mv
				}
				continue
			}
		}
		base[k] = v
	}
	return base
}

// validateProxyConfig checks the ProxyConfig fields the agent uses; every
// error names the field and the value.
func validateProxyConfig(pc *meshconfig.ProxyConfig) error {
	var errs []error
	if pc.StatusPort < 0 || pc.StatusPort > 65535 {
		errs = append(errs, fmt.Errorf("ProxyConfig statusPort %d: not a port (0 disables the status server)", pc.StatusPort))
	}
	if pc.ProxyAdminPort < 1 || pc.ProxyAdminPort > 65535 {
		errs = append(errs, fmt.Errorf("ProxyConfig proxyAdminPort %d: not a port", pc.ProxyAdminPort))
	}
	if pc.StatusPort != 0 && pc.StatusPort == pc.ProxyAdminPort {
		errs = append(errs, fmt.Errorf("ProxyConfig statusPort and proxyAdminPort are both %d", pc.StatusPort))
	}
	if pc.BinaryPath == "" {
		errs = append(errs, errors.New("ProxyConfig binaryPath is empty"))
	}
	if pc.ConfigPath == "" {
		errs = append(errs, errors.New("ProxyConfig configPath is empty"))
	}
	if _, port, err := net.SplitHostPort(pc.DiscoveryAddress); err != nil {
		errs = append(errs, fmt.Errorf("ProxyConfig discoveryAddress %s: %v", quoteValue(pc.DiscoveryAddress), err))
	} else if p, err := strconv.ParseUint(port, 10, 16); err != nil || p == 0 {
		errs = append(errs, fmt.Errorf("ProxyConfig discoveryAddress %s: bad port %s", quoteValue(pc.DiscoveryAddress), quoteValue(port)))
	}
	if d := pc.GetDrainDuration(); d != nil && d.AsDuration() <= 0 {
		errs = append(errs, fmt.Errorf("ProxyConfig drainDuration %s must be positive", d.AsDuration()))
	}
	if d := pc.GetTerminationDrainDuration(); d != nil && d.AsDuration() < 0 {
		errs = append(errs, fmt.Errorf("ProxyConfig terminationDrainDuration %s is negative", d.AsDuration()))
	}
	if c := pc.GetConcurrency(); c != nil && c.GetValue() < 0 {
		errs = append(errs, fmt.Errorf("ProxyConfig concurrency %d is negative", c.GetValue()))
	}
	return errors.Join(errs...)
}

// applyConcurrency sets Envoy's worker count as Istio's agent does
// (pilot/cmd/pilot-agent/config): ProxyConfig.concurrency if the layers set
// it, else ISTIO_CPU_LIMIT (the container's CPU limit, rounded up) when not
// 0; then the legacy --concurrency flag, when given and not 0, overrides
// both. Unset, Envoy runs a worker per host CPU.
func applyConcurrency(pc *meshconfig.ProxyConfig, cpuLimit int, legacyFlag *int, log *slog.Logger) {
	if pc.Concurrency == nil && cpuLimit > 0 {
		pc.Concurrency = wrapperspb.Int32(int32(cpuLimit))
	}
	if legacyFlag != nil && *legacyFlag != 0 {
		log.Warn("legacy --concurrency flag given; prefer ProxyConfig.concurrency", "concurrency", *legacyFlag)
		pc.Concurrency = wrapperspb.Int32(int32(*legacyFlag))
	}
}
