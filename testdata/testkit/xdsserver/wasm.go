package xdsserver

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	udpa "github.com/cncf/xds/go/udpa/type/v1"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	httpwasm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/wasm/v3"
	netwasm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/wasm/v3"
	wasmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/wasm/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
)

// ErrRemoteWasm: a Wasm filter's code is remote. Envoy cannot load an
// oci:// module at all, and fetches an http(s) one only through a cluster
// of its own configuration; Istio's agent makes every remote module local
// before Envoy sees it (#35), so the stand-ins refuse any.
var ErrRemoteWasm = errors.New("remote Wasm code: Envoy loads only local modules here (the agent must fetch it)")

// FileRoot maps the file names in Envoy's configuration to where the test
// finds them: names under From are read under To (an agent that wrote
// them in a mount namespace of its own). Zero: as they are.
type FileRoot struct{ From, To string }

func (r FileRoot) path(name string) string {
	if rest, ok := strings.CutPrefix(name, r.From); ok && r.From != "" {
		return r.To + rest
	}
	return name
}

// CheckWasm is what Envoy checks of an ECDS resource's Wasm code when it
// loads it: a local module must be a readable file (found through files)
// starting with Wasm's magic number, and remote code is refused
// (ErrRemoteWasm). Any other resource passes.
func CheckWasm(a *anypb.Any, files FileRoot) error {
	ec := new(corev3.TypedExtensionConfig)
	if a.GetTypeUrl() != "type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig" || a.UnmarshalTo(ec) != nil {
		return nil
	}
	tc := ec.GetTypedConfig()
	var cfg *wasmv3.PluginConfig
	msg := func(typeURL string) proto.Message {
		switch typeURL {
		case "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm":
			return new(httpwasm.Wasm)
		case "type.googleapis.com/envoy.extensions.filters.network.wasm.v3.Wasm":
			return new(netwasm.Wasm)
		}
		return nil
	}
	m := msg(tc.GetTypeUrl())
	switch {
	case m != nil:
		if err := tc.UnmarshalTo(m); err != nil {
			return err
		}
	case tc.GetTypeUrl() == "type.googleapis.com/udpa.type.v1.TypedStruct":
		ts := new(udpa.TypedStruct)
		if err := tc.UnmarshalTo(ts); err != nil {
			return err
		}
		if m = msg(ts.GetTypeUrl()); m == nil {
			return nil
		}
		js, err := protojson.Marshal(ts.GetValue())
		if err == nil {
			err = protojson.Unmarshal(js, m)
		}
		if err != nil {
			return err
		}
	default:
		return nil
	}
	cfg = m.(interface{ GetConfig() *wasmv3.PluginConfig }).GetConfig()
	code := cfg.GetVmConfig().GetCode()
	if r := code.GetRemote(); r != nil {
		return fmt.Errorf("extension config %s: %w: %s", ec.GetName(), ErrRemoteWasm, r.GetHttpUri().GetUri())
	}
	local := code.GetLocal()
	var module []byte
	switch {
	case local.GetFilename() != "":
		b, err := os.ReadFile(files.path(local.GetFilename()))
		if err != nil {
			return fmt.Errorf("extension config %s: cannot read the Wasm module: %w", ec.GetName(), err)
		}
		module = b
	case local.GetInlineBytes() != nil:
		module = local.GetInlineBytes()
	default:
		return fmt.Errorf("extension config %s: the Wasm filter has no code", ec.GetName())
	}
	if len(module) < 8 || !bytes.Equal(module[:4], []byte("\x00asm")) {
		return fmt.Errorf("extension config %s: %s is not a Wasm module", ec.GetName(), local.GetFilename())
	}
	return nil
}

// ExtensionConfig is an ECDS resource as a client holds it: the
// TypedExtensionConfig, and the filter it configures decoded.
func ExtensionConfig(t testing.TB, a *anypb.Any) (*corev3.TypedExtensionConfig, proto.Message) {
	t.Helper()
	ec := new(corev3.TypedExtensionConfig)
	if err := a.UnmarshalTo(ec); err != nil {
		t.Fatal(err)
	}
	m, err := ec.GetTypedConfig().UnmarshalNew()
	if err != nil {
		t.Fatal(err)
	}
	return ec, m
}

// TypedStruct is filter inside a TypedStruct (its fields as JSON, under
// its own type URL), as some control planes send a filter.
func TypedStruct(t testing.TB, filter proto.Message) *udpa.TypedStruct {
	t.Helper()
	js, err := protojson.Marshal(filter)
	if err != nil {
		t.Fatal(err)
	}
	st := new(structpb.Struct)
	if err := protojson.Unmarshal(js, st); err != nil {
		t.Fatal(err)
	}
	return &udpa.TypedStruct{TypeUrl: "type.googleapis.com/" + string(filter.ProtoReflect().Descriptor().FullName()), Value: st}
}
