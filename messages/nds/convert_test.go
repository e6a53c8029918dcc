package nds

import (
	"net/netip"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

func TestToMessage(t *testing.T) {
	in := &NameTable{Table: map[string]*NameTable_NameInfo{
		"reviews.default.svc.cluster.local": {
			Ips: []string{"10.0.0.1", "fd00::1"}, Registry: "Kubernetes",
			Shortname: "reviews", Namespace: "default", AltHosts: []string{"rev.example"},
		},
		"example.com": {Ips: []string{"::ffff:192.0.2.1"}},
	}}
	// Through the wire, as it comes from istiod.
	b, err := proto.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	var back NameTable
	if err := proto.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	got, err := ToMessage(&back, "v7")
	if err != nil {
		t.Fatal(err)
	}
	if got.Version != "v7" || len(got.Hosts) != 2 {
		t.Fatalf("got %+v", got)
	}
	r := got.Hosts["reviews.default.svc.cluster.local"]
	if r.Registry != "Kubernetes" || r.Shortname != "reviews" || r.Namespace != "default" ||
		len(r.AltHosts) != 1 || r.AltHosts[0] != "rev.example" {
		t.Fatalf("reviews = %+v", r)
	}
	if len(r.IPs) != 2 || r.IPs[0] != netip.MustParseAddr("10.0.0.1") || r.IPs[1] != netip.MustParseAddr("fd00::1") {
		t.Fatalf("reviews IPs = %v", r.IPs)
	}
	// A v4-mapped address is an IPv4 address (an A record), as Istio treats it.
	if e := got.Hosts["example.com"]; len(e.IPs) != 1 || !e.IPs[0].Is4() {
		t.Fatalf("example.com IPs = %v", e.IPs)
	}
}

func TestToMessageBadIP(t *testing.T) {
	in := &NameTable{Table: map[string]*NameTable_NameInfo{
		"good.example": {Ips: []string{"10.0.0.1"}},
		"bad.example":  {Ips: []string{"10.0.0.2", "10.0.0.300"}},
	}}
	_, err := ToMessage(in, "v1")
	if err == nil {
		t.Fatal("no error for a bad IP")
	}
	if !strings.Contains(err.Error(), `"bad.example"`) || !strings.Contains(err.Error(), `"10.0.0.300"`) {
		t.Fatalf("error does not name host and value: %v", err)
	}
}

func TestFieldNumbersAreIstios(t *testing.T) {
	fields := (&NameTable_NameInfo{}).ProtoReflect().Descriptor().Fields()
	want := map[string]int32{"ips": 1, "registry": 2, "shortname": 3, "namespace": 4, "alt_hosts": 5}
	for name, num := range want {
		f := fields.ByName(protoreflectName(name))
		if f == nil || int32(f.Number()) != num {
			t.Errorf("NameInfo.%s: got %v, want field %d", name, f, num)
		}
	}
	if got := (&NameTable{}).ProtoReflect().Descriptor().FullName(); got != "istio.networking.nds.v1.NameTable" {
		t.Errorf("full name = %s", got)
	}
}

func protoreflectName(s string) protoreflect.Name { return protoreflect.Name(s) }
