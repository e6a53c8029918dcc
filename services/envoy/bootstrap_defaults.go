package envoy

import "path/filepath"

// Istio's defaults for the values WithDefaults fills in.
const (
	DefaultConfigPath          = "./etc/istio/proxy"
	DefaultSDSSocket           = "./var/run/secrets/workload-spiffe-uds/socket"
	DefaultLabelsFile          = "./etc/istio/pod/labels"
	DefaultAnnotationsFile     = "./etc/istio/pod/annotations"
	DefaultAdminPort           = 15000
	DefaultStatusPort          = 15020
	DefaultEnvoyStatusPort     = 15021
	DefaultEnvoyPrometheusPort = 15090
)

// WithDefaults returns c with every empty field that has an Istio default filled in: ProxyType
// sidecar, ConfigPath/AdminPort/StatusPort from the ProxyConfig (else Istio's defaults),
// XDSSocket <ConfigPath>/XDS, SDSSocket, the Downward API files, ports 15021 and 15090. Paths are
// relative to the agent's working directory, as in Istio; cmd applies --root before or after as it
// needs. Fields without a default (pod identity, IPs) are left for Validate to report.
func (c BootstrapConfig) WithDefaults() BootstrapConfig {
	if c.ProxyType == "" {
		c.ProxyType = "sidecar"
	}
	if c.ConfigPath == "" {
		c.ConfigPath = c.Proxy.GetConfigPath()
		if c.ConfigPath == "" {
			c.ConfigPath = DefaultConfigPath
		}
	}
	if c.XDSSocket == "" {
		c.XDSSocket = filepath.Join(c.ConfigPath, "XDS")
		if !filepath.IsAbs(c.XDSSocket) {
			c.XDSSocket = "./" + c.XDSSocket // Istio's form: ./etc/istio/proxy/XDS
		}
	}
	if c.SDSSocket == "" {
		c.SDSSocket = DefaultSDSSocket
	}
	if c.LabelsFile == "" {
		c.LabelsFile = DefaultLabelsFile
	}
	if c.AnnotationsFile == "" {
		c.AnnotationsFile = DefaultAnnotationsFile
	}
	if c.AdminPort == 0 {
		c.AdminPort = int(c.Proxy.GetProxyAdminPort())
		if c.AdminPort == 0 {
			c.AdminPort = DefaultAdminPort
		}
	}
	if c.StatusPort == 0 {
		c.StatusPort = int(c.Proxy.GetStatusPort())
		if c.StatusPort == 0 {
			c.StatusPort = DefaultStatusPort
		}
	}
	if c.EnvoyStatusPort == 0 {
		c.EnvoyStatusPort = DefaultEnvoyStatusPort
	}
	if c.EnvoyPrometheusPort == 0 {
		c.EnvoyPrometheusPort = DefaultEnvoyPrometheusPort
	}
	return c
}
