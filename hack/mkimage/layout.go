package main

// The layout of Istio's proxyv2 image (pilot/docker/Dockerfile.proxyv2 and
// the injector's manifests/charts/istio-control/istio-discovery/files/
// injection-template.yaml), which an injected pod and Istio's tools rely on
// by path (#20), beyond the files package image names.
// The paths of proxyv2's files are package image's (image.AgentPath...):
// `meshagent image` checks a base for them and layers onto them.
const (
	proxyUID  = 1337 // istio-proxy: the injector's runAsUser and the capture rules' exempt owner
	proxyGID  = 1337
	proxyUser = "istio-proxy"
)

// proxyDirs are the directories the injected istio-proxy container mounts
// (emptyDir, projected token, ConfigMap, Downward API) or writes to. They
// exist in the image owned by istio-proxy so that the container also works
// where a volume is missing (a hand-written pod, readOnlyRootFilesystem off).
var proxyDirs = []string{
	"/etc/istio/proxy",                             // istio-envoy: bootstrap, SDS and XDS sockets
	"/etc/istio/pod",                               // istio-podinfo: labels, annotations
	"/etc/istio/config",                            // mesh config on VMs
	"/var/lib/istio/data",                          // istio-data
	"/var/lib/istio/envoy",                         // the template's directory (Istio's image: root-owned, ours: writable for cluster.env)
	"/var/run/secrets/istio",                       // istiod-ca-cert
	"/var/run/secrets/tokens",                      // istio-token (audience istio-ca)
	"/var/run/secrets/workload-spiffe-uds",         // workload-socket
	"/var/run/secrets/credential-uds",              // credential-socket
	"/var/run/secrets/workload-spiffe-credentials", // workload-certs
	"/etc/certs",                                   // mountMtlsCerts / FILE_MOUNTED_CERTS
}

// path is the image's PATH: /usr/sbin for iptables, as Istio's base image.
const path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// iptablesCommands are the names our capture code (services/capture: the
// backend choice execs iptables-legacy-save to look for rules, then the
// -nft, then the plain names) and coreos/go-iptables exec, for both
// families. The plain names are nft, as Istio's base image sets them
// (update-alternatives --set iptables /usr/sbin/iptables-nft).
func iptablesCommands() map[string]string {
	links := map[string]string{}
	for _, fam := range []string{"iptables", "ip6tables"} {
		for _, op := range []string{"", "-save", "-restore"} {
			links[fam+op] = "xtables-nft-multi"
			links[fam+"-nft"+op] = "xtables-nft-multi"
			links[fam+"-legacy"+op] = "xtables-legacy-multi"
		}
	}
	return links
}
