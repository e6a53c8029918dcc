package xdsproxy

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"strings"

	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	meshconfig "istio.io/api/mesh/v1alpha1"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/messages/nds"
)

// Type URLs, as Istio names them (pkg/model/xds.go). Which types reach
// Envoy is protocol.Forwardable.
const (
	typePrefix   = "type.googleapis.com/"
	clusterType  = typePrefix + "envoy.config.cluster.v3.Cluster"
	endpointType = typePrefix + "envoy.config.endpoint.v3.ClusterLoadAssignment"
	listenerType = typePrefix + "envoy.config.listener.v3.Listener"
	routeType    = typePrefix + "envoy.config.route.v3.RouteConfiguration"
	// extensionConfigType (ECDS): remote Wasm modules (http, oci) are
	// fetched and the resources rewritten to local files before Envoy
	// gets them, as Istio's agent does (ecds.go, #35).
	extensionConfigType = typePrefix + "envoy.config.core.v3.TypedExtensionConfig"
	// The agent's own types: answered by the control plane, consumed here.
	nameTableType   = typePrefix + "istio.networking.nds.v1.NameTable"
	proxyConfigType = typePrefix + "istio.mesh.v1alpha1.ProxyConfig"
	// healthInfoType is only ever sent upstream (VM health).
	healthInfoType = typePrefix + "istio.v1.HealthInformation"
)

// agentType reports whether responses of typeURL are consumed by the agent.
func (s *Service) agentType(typeURL string) bool {
	return (typeURL == nameTableType && s.cfg.NDS) || (typeURL == proxyConfigType && s.cfg.ProxyConfigXDS)
}

// internalError is the error_detail of the agent's own requests (a NACK
// of an agent type, Istio's report of an unhealthy workload): code
// Internal, as Istio's agent sends.
func internalError(msg string) *rpcstatus.Status {
	return &rpcstatus.Status{Code: int32(codes.Internal), Message: msg}
}

// consume applies one resource of an agent type: the name table goes to the
// DNS proxy, the ProxyConfig's trust anchors to SDS. An error is the NACK's
// message; nothing is published then, so the last good value stays.
func (s *Service) consume(typeURL string, res *anypb.Any, version string) error {
	if res.GetTypeUrl() != typeURL {
		return fmt.Errorf("resource of type %q in a %s response", res.GetTypeUrl(), typeURL)
	}
	switch typeURL {
	case nameTableType:
		nt, err := decodeNameTable(res.GetValue(), version)
		if err != nil {
			return err
		}
		s.out.Names.Send(nt)
		s.log.Debug("name table received", "version", version, "hosts", len(nt.Hosts))
	case proxyConfigType:
		var pc meshconfig.ProxyConfig
		if err := proto.Unmarshal(res.GetValue(), &pc); err != nil {
			return fmt.Errorf("decode ProxyConfig: %w", err)
		}
		anchors := messages.TrustAnchors{Version: version}
		for i, p := range pc.GetCaCertificatesPem() {
			if err := checkPEMCerts([]byte(p)); err != nil {
				return fmt.Errorf("ProxyConfig caCertificatesPem[%d]: %w", i, err)
			}
			anchors.PEM = append(anchors.PEM, []byte(p))
		}
		s.out.Anchors.Send(anchors)
		s.log.Info("trust anchors received from ProxyConfig", "version", version, "certificates", len(anchors.PEM))
	default:
		return fmt.Errorf("type %s is not handled by the agent", typeURL)
	}
	return nil
}

// decodeNameTable decodes a serialized NameTable (from NDS, or the cache)
// into the DNS proxy's message.
func decodeNameTable(b []byte, version string) (messages.NameTable, error) {
	var t nds.NameTable
	if err := proto.Unmarshal(b, &t); err != nil {
		return messages.NameTable{}, fmt.Errorf("decode name table: %w", err)
	}
	return nds.ToMessage(&t, version)
}

// checkPEMCerts accepts one or more PEM certificates and nothing else, so
// that a bad anchor is NACKed here rather than breaking SDS's ROOTCA.
func checkPEMCerts(b []byte) error {
	n := 0
	for {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		if blk == nil {
			break
		}
		if blk.Type != "CERTIFICATE" {
			return fmt.Errorf("PEM block %q is not a CERTIFICATE", blk.Type)
		}
		if _, err := x509.ParseCertificate(blk.Bytes); err != nil {
			return err
		}
		n++
	}
	if n == 0 || strings.TrimSpace(string(b)) != "" {
		return errors.New("not PEM certificates")
	}
	return nil
}
