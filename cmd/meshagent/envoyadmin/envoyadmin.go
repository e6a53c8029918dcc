// Package envoyadmin reads Envoy's admin /config_dump (envoy.admin.v3.
// ConfigDump) as a real Envoy serves it and as the stand-in Envoy serves it
// too (issue 22): one decoder for `meshagent proxy-config`, the stand-in and
// the tests (testdata/testkit/envoyadmin re-exports it), so that none of
// them reads a shape of its own. It lives beside the commands because a
// command cannot import testdata.
package envoyadmin

import (
	"fmt"
	"strings"
	"sync"

	adminv3 "github.com/envoyproxy/go-control-plane/envoy/admin/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"
	"google.golang.org/protobuf/types/known/anypb"
)

// Resolver resolves every type URL: the linked-in types as themselves, any
// other (an Istio filter's config, say) as an empty message of that name,
// so a dump holding types this binary does not know still encodes and
// decodes, with those configs shown by their type URL alone.
var Resolver = &resolver{unknown: map[string]protoreflect.MessageType{}}

type resolver struct {
	mu      sync.Mutex
	unknown map[string]protoreflect.MessageType
}

func (r *resolver) FindMessageByURL(url string) (protoreflect.MessageType, error) {
	if mt, err := protoregistry.GlobalTypes.FindMessageByURL(url); err == nil {
		return mt, nil
	}
	full := url[strings.LastIndex(url, "/")+1:]
	r.mu.Lock()
	defer r.mu.Unlock()
	if mt, ok := r.unknown[full]; ok {
		return mt, nil
	}
	pkg, name := "", full
	if i := strings.LastIndex(full, "."); i >= 0 {
		pkg, name = full[:i], full[i+1:]
	}
	fd, err := protodesc.NewFile(&descriptorpb.FileDescriptorProto{
		Name: proto.String("envoyadmin/unknown/" + full + ".proto"), Package: proto.String(pkg),
		Syntax:      proto.String("proto3"),
		MessageType: []*descriptorpb.DescriptorProto{{Name: proto.String(name)}},
	}, nil)
	if err != nil {
		return nil, fmt.Errorf("type %s: %w", url, err)
	}
	mt := dynamicpb.NewMessageType(fd.Messages().Get(0))
	r.unknown[full] = mt
	return mt, nil
}

func (r *resolver) FindMessageByName(name protoreflect.FullName) (protoreflect.MessageType, error) {
	return r.FindMessageByURL(string(name))
}

func (r *resolver) FindExtensionByName(field protoreflect.FullName) (protoreflect.ExtensionType, error) {
	return protoregistry.GlobalTypes.FindExtensionByName(field)
}

func (r *resolver) FindExtensionByNumber(message protoreflect.FullName, field protoreflect.FieldNumber) (protoreflect.ExtensionType, error) {
	return protoregistry.GlobalTypes.FindExtensionByNumber(message, field)
}

// Dump is a decoded /config_dump.
type Dump struct{ *adminv3.ConfigDump }

// Decode reads a /config_dump body. A config of a type this binary does
// not link (Istio's own filters: istio.stats, TypedStruct in a binary
// without the Wasm fetch) is an empty message of that name, and the fields
// Envoy wrote for it are dropped rather than refused: a real Envoy's dump
// holds such types, and refusing them refused the whole dump (the kube
// suite's check, once the stand-in wrote TypedStruct's fields).
func Decode(body []byte) (*Dump, error) {
	d := &adminv3.ConfigDump{}
	if err := (protojson.UnmarshalOptions{Resolver: Resolver, DiscardUnknown: true}).Unmarshal(body, d); err != nil {
		return nil, fmt.Errorf("not an envoy.admin.v3.ConfigDump: %w", err)
	}
	return &Dump{d}, nil
}

// config is the dump's config of type T, nil if absent.
func config[T proto.Message](d *Dump) T {
	var zero T
	for _, a := range d.GetConfigs() {
		m, err := anypb.UnmarshalNew(a, proto.UnmarshalOptions{Resolver: Resolver})
		if t, ok := m.(T); err == nil && ok {
			return t
		}
	}
	return zero
}

// Clusters is the clusters dump.
func (d *Dump) Clusters() *adminv3.ClustersConfigDump { return config[*adminv3.ClustersConfigDump](d) }

// Listeners is the listeners dump.
func (d *Dump) Listeners() *adminv3.ListenersConfigDump {
	return config[*adminv3.ListenersConfigDump](d)
}

// Routes is the routes dump.
func (d *Dump) Routes() *adminv3.RoutesConfigDump { return config[*adminv3.RoutesConfigDump](d) }

// Endpoints is the endpoints dump (only with ?include_eds).
func (d *Dump) Endpoints() *adminv3.EndpointsConfigDump {
	return config[*adminv3.EndpointsConfigDump](d)
}

// Secrets is the secrets dump.
func (d *Dump) Secrets() *adminv3.SecretsConfigDump { return config[*adminv3.SecretsConfigDump](d) }

// Bootstrap is the bootstrap dump (`proxy-config bootstrap`, #35), nil if
// absent.
func (d *Dump) Bootstrap() *adminv3.BootstrapConfigDump {
	return config[*adminv3.BootstrapConfigDump](d)
}

// Secret is the dynamic secret named name, nil if Envoy has none
// (`proxy-config secret`, rootca-compare, #35).
func (d *Dump) Secret(name string) *tlsv3.Secret {
	for _, s := range d.Secrets().GetDynamicActiveSecrets() {
		if s.GetName() != name {
			continue
		}
		sec := &tlsv3.Secret{}
		if s.GetSecret().UnmarshalTo(sec) == nil {
			return sec
		}
	}
	return nil
}
