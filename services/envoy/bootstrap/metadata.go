package bootstrap

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
)

// Istio's agent does not copy the ISTIO_META_* values into the node metadata
// as it finds them: it decodes them into its typed node metadata
// (pkg/model NodeMetadata and BootstrapNodeMetadata), writes the typed fields
// back, then adds the values it has no field for (pkg/bootstrap/option
// marshalMetadata). So a value with a typed field is normalized
// (ISTIO_META_DNS_CAPTURE=TRUE is written "true", ISTIO_META_POD_PORTS is
// re-marshalled compact), one that does not decode stops the agent
// (ISTIO_META_ENVOY_STATUS_PORT=abc: the field is a number), and one that
// decodes to the field's zero value (false, "", 0) is left out by the typed
// pass, so the raw value shows through unchanged. metadataKinds lists those
// fields; normalizeTypedMetadata plays that pass.

// metaKind is how Istio's typed node metadata decodes a field.
type metaKind int

const (
	metaString      metaKind = iota // a JSON string
	metaStringBool                  // model.StringBool: a string strconv.ParseBool accepts, written "true"/"false"
	metaStringList                  // model.StringList: a comma-separated string
	metaInt                         // a JSON number, integral
	metaStringMap                   // an object of strings
	metaStrings                     // an array of strings
	metaPodPorts                    // model.PodPortList: a string holding a JSON array of ports
	metaObject                      // ProxyConfig: an object (the agent writes its own)
	metaBoolPointer                 // *model.StringBool: as metaStringBool, false written too
)

// metadataKinds are the typed node metadata fields of Istio's agent, by JSON name.
var metadataKinds = map[string]metaKind{
	// model.NodeMetadata
	"PROXY_CONFIG":                     metaObject,
	"ISTIO_VERSION":                    metaString,
	"ISTIO_REVISION":                   metaString,
	"LABELS":                           metaStringMap,
	"STATIC_LABELS":                    metaStringMap,
	"ANNOTATIONS":                      metaStringMap,
	"INSTANCE_IPS":                     metaStringList,
	"NAMESPACE":                        metaString,
	"NODE_NAME":                        metaString,
	"WORKLOAD_NAME":                    metaString,
	"INTERCEPTION_MODE":                metaString,
	"SERVICE_ACCOUNT":                  metaString,
	"HTTP_PROXY_PORT":                  metaString,
	"MESH_ID":                          metaString,
	"CLUSTER_ID":                       metaString,
	"NETWORK":                          metaString,
	"REQUESTED_NETWORK_VIEW":           metaStringList,
	"POD_PORTS":                        metaPodPorts,
	"TLS_SERVER_CERT_CHAIN":            metaString,
	"TLS_SERVER_KEY":                   metaString,
	"TLS_SERVER_ROOT_CERT":             metaString,
	"TLS_CLIENT_CERT_CHAIN":            metaString,
	"TLS_CLIENT_KEY":                   metaString,
	"TLS_CLIENT_ROOT_CERT":             metaString,
	"BASE":                             metaString,
	"IDLE_TIMEOUT":                     metaString,
	"HTTP10":                           metaString,
	"GENERATOR":                        metaString,
	"ENABLE_SELF_DISCOVERY":            metaStringBool,
	"DNS_CAPTURE":                      metaStringBool,
	"DNS_AUTO_ALLOCATE":                metaStringBool,
	"DNS_PROXY_ADDR":                   metaString,
	"ENABLE_HBONE":                     metaStringBool,
	"DISABLE_HBONE_SEND":               metaStringBool,
	"AUTO_REGISTER_GROUP":              metaString,
	"WORKLOAD_ENTRY":                   metaString,
	"UNPRIVILEGED_POD":                 metaString,
	"PLATFORM_METADATA":                metaStringMap,
	"STS_PORT":                         metaString,
	"ENVOY_STATUS_PORT":                metaInt,
	"ENVOY_PROMETHEUS_PORT":            metaInt,
	"ENVOY_SECURE_METRICS_PORT":        metaInt,
	"ENVOY_SECURE_MERGED_METRICS_PORT": metaInt,
	"EXIT_ON_ZERO_ACTIVE_CONNECTIONS":  metaStringBool,
	"INBOUND_LISTENER_EXACT_BALANCE":   metaStringBool,
	"OUTBOUND_LISTENER_EXACT_BALANCE":  metaStringBool,
	"CLOUDRUN_ADDR":                    metaString,
	"METADATA_DISCOVERY":               metaBoolPointer,
	"ENVOY_SKIP_DEPRECATED_LOGS":       metaStringBool,
	"WORKLOAD_IDENTITY_SOCKET_FILE":    metaString,
	// model.BootstrapNodeMetadata
	"NAME":             metaString,
	"OWNER":            metaString,
	"PILOT_SAN":        metaStrings,
	"OUTLIER_LOG_PATH": metaString,
	"APP_CONTAINERS":   metaString,
	"ISTIO_PROXY_SHA":  metaString,
}

// normalizeTypedMetadata plays Istio's typed pass over the metadata in place:
// values of typed fields are normalized or, when they do not decode, named
// in the error.
func normalizeTypedMetadata(meta map[string]any) error {
	for key, kind := range metadataKinds {
		v, ok := meta[key]
		if !ok {
			continue
		}
		out, err := decodeTyped(kind, v)
		if err != nil {
			return fmt.Errorf("node metadata %s = %s: %w (Istio's agent refuses it too)", key, jsonString(v), err)
		}
		if out != nil {
			meta[key] = out
		}
	}
	return nil
}

// decodeTyped decodes one value as Istio's typed field does and returns
// what the typed pass writes: nil when it writes nothing (a zero value),
// which leaves the raw value in place.
func decodeTyped(kind metaKind, v any) (any, error) {
	switch kind {
	case metaString, metaStringList:
		s, ok := v.(string)
		if !ok {
			return nil, fmt.Errorf("want a string")
		}
		if s == "" {
			return nil, nil
		}
		return s, nil
	case metaStringBool, metaBoolPointer:
		s, ok := v.(string)
		if !ok {
			return nil, fmt.Errorf(`want a string "true" or "false"`)
		}
		b, err := strconv.ParseBool(s)
		if err != nil {
			return nil, fmt.Errorf(`want a string "true" or "false"`)
		}
		if !b && kind == metaStringBool {
			return nil, nil
		}
		return strconv.FormatBool(b), nil
	case metaInt:
		f, ok := v.(float64)
		if !ok || f != math.Trunc(f) {
			return nil, fmt.Errorf("want a number")
		}
		if f == 0 {
			return nil, nil
		}
		return f, nil
	case metaStringMap:
		m, ok := v.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("want an object of strings")
		}
		for _, x := range m {
			if _, ok := x.(string); !ok && x != nil {
				return nil, fmt.Errorf("want an object of strings")
			}
		}
		if len(m) == 0 {
			return nil, nil
		}
		return m, nil
	case metaStrings:
		l, ok := v.([]any)
		if !ok {
			return nil, fmt.Errorf("want an array of strings")
		}
		for _, x := range l {
			if _, ok := x.(string); !ok {
				return nil, fmt.Errorf("want an array of strings")
			}
		}
		if len(l) == 0 {
			return nil, nil
		}
		return l, nil
	case metaPodPorts:
		s, ok := v.(string)
		if !ok {
			return nil, fmt.Errorf("want a string holding a JSON array of ports")
		}
		var ports []podPort
		if err := json.Unmarshal([]byte(s), &ports); err != nil {
			return nil, fmt.Errorf("want a string holding a JSON array of ports: %v", err)
		}
		if len(ports) == 0 {
			return nil, nil
		}
		b, _ := json.Marshal(ports)
		return string(b), nil
	case metaObject:
		if _, ok := v.(map[string]any); !ok {
			return nil, fmt.Errorf("want an object")
		}
		return nil, nil // the agent writes its own
	}
	return nil, nil
}

// podPort is a container port as Istio's model.PodPort writes it.
type podPort struct {
	Name          string `json:"name,omitempty"`
	ContainerPort int    `json:"containerPort"`
	Protocol      string `json:"protocol"`
}

func jsonString(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}

// Platform is what the agent knows of the cloud it runs on (Istio's
// pkg/bootstrap/platform): metadata for PLATFORM_METADATA and the zone, the
// locality when the pod's labels name none.
type Platform struct {
	Metadata map[string]string
	Zone     string // a GCP zone such as us-central1-a; its region is the part before the last '-'
}

// locality is the platform's locality: GCP's region and zone.
func (p Platform) locality() *corev3.Locality {
	i := strings.LastIndex(p.Zone, "-")
	if i <= 0 || strings.Count(p.Zone, "-") != 2 {
		return &corev3.Locality{} // Istio: not a zone it can take a region from
	}
	return &corev3.Locality{Region: p.Zone[:i], Zone: p.Zone}
}
