package config

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"
)

// Essentials are what the start's one info line shows of the plan (#32:
// the whole configuration, ~21 KB, was logged at info): the proxy type, the
// node id, the addresses the agent and Envoy serve, the root.
func (p *Plan) Essentials() []any {
	attrs := []any{"type", p.ProxyType}
	if x := p.Tree.XDS; x != nil {
		attrs = append(attrs, "node", x.NodeID)
	}
	if s := p.Tree.Status; s != nil {
		attrs = append(attrs, "status", s.Addr)
	}
	if e := p.Tree.Envoy; e != nil {
		attrs = append(attrs, "admin", e.AdminAddr)
	}
	if d := p.Tree.DNS; d != nil {
		attrs = append(attrs, "dns", d.Listen)
	}
	return append(attrs, "root", p.Root)
}

// LogEffective logs at debug, once at start, what every service runs with
// (kuma-dp's "effective configuration"), secrets redacted: one line per
// part (the ProxyConfig, each service's config, the tree's own settings),
// each as nested attributes rather than one escaped JSON value, so that a
// text log reads `part=envoy AdminAddr=127.0.0.1:15000 ...` and a JSON log
// gets objects (issue 22: it was one 10 KB line of escaped JSON). The info
// line is Essentials' (#32).
func LogEffective(log *slog.Logger, cfg *Plan) {
	if !log.Enabled(context.Background(), slog.LevelDebug) {
		return
	}
	parts := effectiveParts(cfg)
	log.Debug("effective configuration", append([]any{"part", "proxyConfig"}, configAttrs(parts["proxyConfig"])...)...)
	tree, _ := parts["tree"].(map[string]any)
	var treeOwn []any
	for _, name := range slices.Sorted(maps.Keys(tree)) {
		switch v := tree[name].(type) {
		case nil: // a service this agent does not run
		case map[string]any:
			log.Debug("effective configuration", append([]any{"part", name}, configAttrs(v)...)...)
		default:
			treeOwn = append(treeOwn, slog.Any(name, configValue(v)))
		}
	}
	if len(treeOwn) > 0 {
		log.Debug("effective configuration", append([]any{"part", "tree"}, treeOwn...)...)
	}
}

// configAttrs turns a described config (maps of values) into log
// attributes: nested objects become groups, unset values are left out.
func configAttrs(v any) []any {
	m, ok := v.(map[string]any)
	if !ok {
		return []any{slog.Any("value", configValue(v))}
	}
	var attrs []any
	for _, k := range slices.Sorted(maps.Keys(m)) {
		switch x := m[k].(type) {
		case nil:
		case map[string]any:
			if len(x) > 0 {
				attrs = append(attrs, slog.Group(k, configAttrs(x)...))
			}
		default:
			attrs = append(attrs, slog.Any(k, configValue(x)))
		}
	}
	return attrs
}

// configValue is a leaf for the log: lists of plain values as one
// space-separated value, lists of objects as compact JSON.
func configValue(v any) any {
	list, ok := v.([]any)
	if !ok {
		if names, ok := v.([]string); ok {
			return strings.Join(names, " ")
		}
		return v
	}
	plain := make([]string, 0, len(list))
	for _, e := range list {
		switch e.(type) {
		case map[string]any, []any:
			js, _ := json.Marshal(list)
			return string(js)
		}
		plain = append(plain, fmt.Sprint(e))
	}
	return strings.Join(plain, " ")
}

// effectiveParts is the configuration as JSON-ready values.
func effectiveParts(cfg *Plan) map[string]any {
	return map[string]any{
		"proxyConfig": describe(reflect.ValueOf(cfg.Proxy), "proxyConfig"),
		"tree":        describe(reflect.ValueOf(cfg.Tree), ""),
	}
}

const redacted = "<redacted>"

// Fields whose values are never logged, by their path in tree.Config: the
// environment (tokens travel there) is shown by variable names only, CA
// headers (CA_HEADER_*, often credentials) by header names only; and the
// ProxyConfig in Envoy's bootstrap config is the one logged on its own.
var (
	namesOnly = map[string]bool{
		"Envoy.Env":           true,
		"Envoy.Bootstrap.Env": true,
		"Certs.CAHeaders":     true,
		"XDS.Headers":         true,
	}
	shownElsewhere = map[string]string{
		"Envoy.Bootstrap.Proxy": "(proxyConfig)",
	}
	// secretName matches a field that holds a secret itself rather than a
	// path to one (TokenFile and KeyFile are paths; a Token or PrivateKey
	// field would not be).
	secretName = sync.OnceValue(func() *regexp.Regexp {
		return regexp.MustCompile(`(?i)(token|secret|password|privatekey|credential|httpheader)s?$`)
	})
)

var durationType = reflect.TypeOf(time.Duration(0))

// describe renders v as JSON-ready values: structs as objects of their
// exported fields, durations and file modes as text, protos in their JSON
// form, byte slices (PEM, keys) by length only; functions, channels and
// interfaces (writers, registries, handlers) are left out.
func describe(v reflect.Value, path string) any {
	if s, ok := shownElsewhere[path]; ok {
		return s
	}
	if !v.IsValid() {
		return nil
	}
	if m, ok := v.Interface().(proto.Message); ok && v.Kind() == reflect.Pointer {
		if v.IsNil() {
			return nil
		}
		obj, err := protoObject(m)
		if err != nil {
			return err.Error()
		}
		return obj
	}
	// An unset address (netip.Addr's zero value prints "invalid IP") is
	// unset, not invalid (issue 22: the log said "invalid IP" for an unset
	// host IP).
	if iv, ok := v.Interface().(interface{ IsValid() bool }); ok && v.Kind() != reflect.Pointer && !iv.IsValid() {
		return nil
	}
	switch {
	case v.Type() == durationType:
		return time.Duration(v.Int()).String()
	case v.Type() == reflect.TypeOf(os.FileMode(0)):
		return fmt.Sprintf("%#o", v.Uint())
	}
	switch v.Kind() {
	case reflect.Pointer:
		if v.IsNil() {
			return nil
		}
		return describe(v.Elem(), path)
	case reflect.Struct:
		out := map[string]any{}
		for i := 0; i < v.NumField(); i++ {
			field := v.Type().Field(i)
			if !field.IsExported() || !shown(field.Type) {
				continue
			}
			p := field.Name
			if path != "" {
				p = path + "." + field.Name
			}
			if secretName().MatchString(field.Name) && !v.Field(i).IsZero() {
				out[field.Name] = redacted
				continue
			}
			out[field.Name] = describe(v.Field(i), p)
		}
		if s, ok := v.Interface().(fmt.Stringer); ok && len(out) == 0 {
			return s.String()
		}
		return out
	case reflect.Map:
		if v.IsNil() {
			return nil
		}
		keys := make([]string, 0, v.Len())
		values := map[string]reflect.Value{}
		for _, k := range v.MapKeys() {
			ks := fmt.Sprint(k.Interface())
			keys = append(keys, ks)
			values[ks] = v.MapIndex(k)
		}
		sort.Strings(keys)
		if namesOnly[path] {
			return keys
		}
		out := map[string]any{}
		for _, k := range keys {
			out[k] = describe(values[k], path+"."+k)
		}
		return out
	case reflect.Slice:
		if v.IsNil() {
			return nil
		}
		if v.Type().Elem().Kind() == reflect.Uint8 {
			return fmt.Sprintf("<%d bytes>", v.Len())
		}
		if namesOnly[path] {
			var names []string
			for i := 0; i < v.Len(); i++ {
				name, _, _ := strings.Cut(fmt.Sprint(v.Index(i).Interface()), "=")
				names = append(names, name)
			}
			sort.Strings(names)
			return names
		}
		out := make([]any, v.Len())
		for i := range out {
			out[i] = describe(v.Index(i), path)
		}
		return out
	case reflect.Array:
		if s, ok := v.Interface().(fmt.Stringer); ok {
			return s.String() // netip.Addr and the like
		}
		return fmt.Sprint(v.Interface())
	}
	if s, ok := v.Interface().(fmt.Stringer); ok && v.Kind() != reflect.String {
		return s.String() // enums: capture.Mode, certs.Source
	}
	return v.Interface()
}

// shown says whether a field of this type is configuration rather than
// plumbing (functions, channels, writers and other interfaces).
func shown(t reflect.Type) bool {
	switch t.Kind() {
	case reflect.Func, reflect.Chan, reflect.Interface, reflect.UnsafePointer:
		return false
	case reflect.Map:
		return shown(t.Elem())
	}
	return true
}
