package envoyadmin

import "testing"

// A real Envoy's dump holds configs of types this binary does not link
// (Istio's filters); their fields are dropped, the dump is still read, and
// the resources around them are still there.
func TestDecodeTakesConfigsOfUnknownTypes(t *testing.T) {
	body := []byte(`{"configs": [{
	  "@type": "type.googleapis.com/envoy.admin.v3.ClustersConfigDump",
	  "dynamic_active_clusters": [{"cluster": {
	    "@type": "type.googleapis.com/envoy.config.cluster.v3.Cluster",
	    "name": "outbound|9080||reviews.default.svc.cluster.local",
	    "typed_extension_protocol_options": {"istio.unknown": {
	      "@type": "type.googleapis.com/istio.example.v1.NotLinked",
	      "type_url": "type.googleapis.com/istio.example.v1.Inner", "value": {"a": 1}
	    }}
	  }}]
	}]}`)
	d, err := Decode(body)
	if err != nil {
		t.Fatalf("a dump with a config of an unknown type: %v", err)
	}
	cs := d.Clusters().GetDynamicActiveClusters()
	if len(cs) != 1 {
		t.Fatalf("clusters: %v", cs)
	}
}
