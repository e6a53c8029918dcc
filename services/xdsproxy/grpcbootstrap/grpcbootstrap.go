// Package grpcbootstrap writes the xDS bootstrap file proxyless gRPC
// applications read from GRPC_XDS_BOOTSTRAP, as Istio's agent does
// (pkg/istio-agent/grpcxds/grpc_bootstrap.go): the XDS proxy's socket as
// the one server, the node with GENERATOR=grpc, and a file_watcher
// certificate provider on the workload's certificate files.
//
// It owns the file's JSON shape and its validation. It does not own the
// socket it names or the node's contents (the XDS proxy serves the one,
// cmd builds the other); it is a library the XDS proxy calls once when it
// starts serving. It was part of package xdsproxy until #34 split the
// proxy into packages a reader can hold.
package grpcbootstrap

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/meshagent/meshagent/services/internal/atomicfile"
)

// ServerListenerTemplate is Istio's
// server_listener_resource_name_template: gRPC servers ask for their
// inbound listener by this name, %s being the listening ip:port.
const ServerListenerTemplate = "xds.istio.io/grpc/lds/inbound/%s"

// grpcCertRefresh is how often gRPC's file_watcher provider rereads the
// certificate files (Istio's 15 minutes).
const grpcCertRefresh = 15 * time.Minute

// Config says what to write.
type Config struct {
	// Path is where (GRPC_XDS_BOOTSTRAP, default
	// ./etc/istio/proxy/grpc-bootstrap.json under the root); empty: none.
	Path string
	// Node is the node gRPC clients announce: the caller builds it as for
	// Envoy (id, locality, metadata). Its metadata gets GENERATOR=grpc,
	// which tells istiod to generate gRPC's flavour of configuration.
	Node *corev3.Node
	// CertFile, KeyFile, CAFile are the workload certificate files the
	// "default" file_watcher certificate provider reads (the OUTPUT_CERTS
	// directory's cert-chain.pem, key.pem, root-cert.pem); all empty: no
	// certificate provider (no mTLS for the application).
	CertFile, KeyFile, CAFile string
}

// Validate checks a Config with a Path; a Config without one writes
// nothing and is valid.
func (b Config) Validate() error {
	if b.Path == "" {
		return nil
	}
	if !filepath.IsAbs(b.Path) {
		return fmt.Errorf("GRPCBootstrap.Path (GRPC_XDS_BOOTSTRAP) %q must be an absolute path", b.Path)
	}
	if b.Node.GetId() == "" {
		return errors.New("GRPCBootstrap.Node has no id")
	}
	set := 0
	for _, f := range []string{b.CertFile, b.KeyFile, b.CAFile} {
		if f != "" {
			set++
		}
	}
	if set != 0 && set != 3 {
		return fmt.Errorf("GRPCBootstrap: CertFile %q, KeyFile %q, CAFile %q must be all set or all empty", b.CertFile, b.KeyFile, b.CAFile)
	}
	return nil
}

// grpcBootstrapFile is the JSON grpc-go reads (xds/bootstrap).
type grpcBootstrapFile struct {
	XDSServers     []grpcXDSServer             `json:"xds_servers"`
	Node           json.RawMessage             `json:"node"`
	CertProviders  map[string]grpcCertProvider `json:"certificate_providers,omitempty"`
	ServerTemplate string                      `json:"server_listener_resource_name_template"`
}

type grpcXDSServer struct {
	ServerURI      string             `json:"server_uri"`
	ChannelCreds   []grpcChannelCreds `json:"channel_creds"`
	ServerFeatures []string           `json:"server_features"`
}

type grpcChannelCreds struct {
	Type string `json:"type"`
}

type grpcCertProvider struct {
	PluginName string             `json:"plugin_name"`
	Config     grpcFileWatcherCfg `json:"config"`
}

type grpcFileWatcherCfg struct {
	CertificateFile   string `json:"certificate_file"`
	PrivateKeyFile    string `json:"private_key_file"`
	CACertificateFile string `json:"ca_certificate_file"`
	RefreshInterval   string `json:"refresh_interval"`
}

// JSON is the bootstrap for clients of the socket at
// socketPath: Istio's fields, the node written in protobuf's JSON form
// (which grpc-go parses with protojson).
func JSON(b Config, socketPath string) ([]byte, error) {
	if b.Node.GetId() == "" {
		return nil, errors.New("gRPC bootstrap: the node has no id")
	}
	node := proto.Clone(b.Node).(*corev3.Node)
	if node.Metadata == nil {
		node.Metadata = &structpb.Struct{Fields: map[string]*structpb.Value{}}
	}
	if node.Metadata.Fields == nil {
		node.Metadata.Fields = map[string]*structpb.Value{}
	}
	node.Metadata.Fields["GENERATOR"] = structpb.NewStringValue("grpc")
	nodeJSON, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(node)
	if err != nil {
		return nil, fmt.Errorf("gRPC bootstrap: node: %w", err)
	}
	f := grpcBootstrapFile{
		XDSServers: []grpcXDSServer{{
			// The socket is local and owner-only: no transport security
			// (Istio: "connect locally via agent").
			ServerURI:      "unix://" + socketPath,
			ChannelCreds:   []grpcChannelCreds{{Type: "insecure"}},
			ServerFeatures: []string{"xds_v3"},
		}},
		Node:           nodeJSON,
		ServerTemplate: ServerListenerTemplate,
	}
	if b.CertFile != "" {
		f.CertProviders = map[string]grpcCertProvider{"default": {
			PluginName: "file_watcher",
			Config: grpcFileWatcherCfg{
				CertificateFile:   b.CertFile,
				PrivateKeyFile:    b.KeyFile,
				CACertificateFile: b.CAFile,
				RefreshInterval:   fmt.Sprintf("%ds", int(grpcCertRefresh.Seconds())),
			},
		}}
	}
	out, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(out, '\n'), nil
}

// Write writes the bootstrap to b.Path atomically (a reader
// never sees half a file), 0644 like Istio's: the application may run as
// another user. The directory is created 0700 if missing, as Istio does.
func Write(b Config, socketPath string) error {
	data, err := JSON(b, socketPath)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(b.Path), 0o700); err != nil {
		return fmt.Errorf("gRPC bootstrap %s: %w", b.Path, err)
	}
	if err := atomicfile.Write(b.Path, data, 0o644); err != nil {
		return fmt.Errorf("gRPC bootstrap: %w", err)
	}
	return nil
}
