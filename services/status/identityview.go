package status

import (
	"crypto/sha256"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/meshagent/meshagent/messages"
	"github.com/meshagent/meshagent/services/internal/pemblock"
)

// The workload certificate and the DNS name table as an operator asks
// about them (issue 22): which identity Envoy is serving, until when, from
// which root; which name table DNS answers from. `meshagent proxy-status`
// and the status page print them; /debug/certs and /debug/names serve them.

// CertReport is /debug/certs (proxy-status decodes it).
type CertReport struct {
	// Reported is false until a certificate was published (or the agent
	// has no identity: then /debug/certs is not served).
	Reported  bool       `json:"reported"`
	Version   string     `json:"version,omitempty"`
	SANs      []string   `json:"sans,omitempty"`
	Serial    string     `json:"serial,omitempty"` // hex, as istioctl prints it
	NotBefore *time.Time `json:"not_before,omitempty"`
	NotAfter  *time.Time `json:"not_after,omitempty"`
	// RemainingSeconds is the time left until NotAfter, at the status
	// server's clock; negative once expired.
	RemainingSeconds int64 `json:"remaining_seconds"`
	// RenewAt is when the certificate watcher asks the CA for the next
	// one; absent when it does not (file-mounted certificates).
	RenewAt *time.Time `json:"renew_at,omitempty"`
	// RootSHA256 are the SHA-256 fingerprints of the roots the certificate
	// chains to, as `openssl x509 -fingerprint -sha256` prints them.
	RootSHA256 []string `json:"root_sha256,omitempty"`
	// Roots are those roots, each with its serial and validity, in the
	// same order: what the agent serves as ROOTCA over SDS, for
	// `meshagent proxy-config secret` when Envoy holds none (#35).
	Roots []RootReport `json:"roots,omitempty"`
	// Error says why the published chain could not be read.
	Error string `json:"error,omitempty"`
}

// RootReport is one root of a CertReport.
type RootReport struct {
	SHA256    string    `json:"sha256"`
	Serial    string    `json:"serial"` // hex
	NotBefore time.Time `json:"not_before"`
	NotAfter  time.Time `json:"not_after"`
}

// NamesReport is /debug/names (proxy-status decodes it).
type NamesReport struct {
	Reported bool   `json:"reported"`
	Version  string `json:"version,omitempty"`
	Names    int    `json:"names"`
	// Source is NDS (from the control plane) or file (--name-table).
	Source string `json:"source,omitempty"`
}

// report is the report R of in's latest value, made by of: nil when the
// agent has no such input, an empty report (Reported false) before the
// first value.
func report[T, R any](in messages.Latest[T], of func(T) *R) *R {
	if in == nil {
		return nil
	}
	v, ok := in.Get()
	if !ok {
		return new(R)
	}
	return of(v)
}

// certReport is the certificate now; nil when the agent has no identity.
func (s *Service) certReport() *CertReport { return report(s.in.Certs, s.certReportOf) }

func (s *Service) certReportOf(b messages.CertBundle) *CertReport {
	out := &CertReport{Reported: true, Version: b.Version}
	block, _ := pem.Decode(b.CertChainPEM)
	if block == nil {
		out.Error = "the certificate chain holds no PEM block"
		return out
	}
	leaf, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		out.Error = fmt.Sprintf("the certificate: %v", err)
		return out
	}
	for _, u := range leaf.URIs {
		out.SANs = append(out.SANs, u.String())
	}
	out.SANs = append(out.SANs, leaf.DNSNames...)
	for _, ip := range leaf.IPAddresses {
		out.SANs = append(out.SANs, ip.String())
	}
	out.Serial = leaf.SerialNumber.Text(16)
	nb, na := leaf.NotBefore.UTC(), leaf.NotAfter.UTC()
	out.NotBefore, out.NotAfter = &nb, &na
	out.RemainingSeconds = int64(na.Sub(s.clock.Now()) / time.Second)
	if !b.RenewAt.IsZero() {
		at := b.RenewAt.UTC()
		out.RenewAt = &at
	}
	for der := range pemblock.Certificates(b.RootsPEM) {
		fp := Fingerprint(der)
		out.RootSHA256 = append(out.RootSHA256, fp)
		if root, err := x509.ParseCertificate(der); err == nil {
			out.Roots = append(out.Roots, RootReport{SHA256: fp, Serial: root.SerialNumber.Text(16),
				NotBefore: root.NotBefore.UTC(), NotAfter: root.NotAfter.UTC()})
		}
	}
	return out
}

// Fingerprint is der's SHA-256 as openssl prints it (AB:CD:...), as
// /debug/certs shows the roots: `meshagent proxy-config rootca-compare`
// prints Envoy's ROOTCA the same way (#35).
func Fingerprint(der []byte) string {
	sum := sha256.Sum256(der)
	hex := strings.ToUpper(fmt.Sprintf("%x", sum))
	var b strings.Builder
	for i := 0; i < len(hex); i += 2 {
		if i > 0 {
			b.WriteByte(':')
		}
		b.WriteString(hex[i : i+2])
	}
	return b.String()
}

// namesReport is the name table now; nil when the agent has none.
func (s *Service) namesReport() *NamesReport { return report(s.in.Names, namesReportOf) }

func namesReportOf(t messages.NameTable) *NamesReport {
	// A table read from a file has a "file-" version (dnsproxy's
	// tablefile.go); any other came over NDS.
	source := "NDS"
	if strings.HasPrefix(t.Version, "file-") {
		source = "file"
	}
	return &NamesReport{Reported: true, Version: t.Version, Names: len(t.Hosts), Source: source}
}

func (s *Service) handleCerts(w http.ResponseWriter, _ *http.Request) { writeJSON(w, s.certReport()) }

func (s *Service) handleNames(w http.ResponseWriter, _ *http.Request) { writeJSON(w, s.namesReport()) }

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
