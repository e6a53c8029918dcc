// Command devcerts writes a throwaway mesh identity for local runs and
// tests: a root CA and a workload certificate for
// spiffe://<trust-domain>/ns/<ns>/sa/<sa>, as file-mounted certs
// (cert-chain.pem, key.pem, root-cert.pem). Never use them in production.
package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"flag"
	"fmt"
	"math/big"
	"net/url"
	"os"
	"path/filepath"
	"time"
)

func main() {
	out := flag.String("out", "", "directory to write cert-chain.pem, key.pem and root-cert.pem into")
	trustDomain := flag.String("trust-domain", "cluster.local", "SPIFFE trust domain")
	ns := flag.String("namespace", "default", "workload namespace")
	sa := flag.String("service-account", "default", "workload service account")
	lifetime := flag.Duration("lifetime", 24*time.Hour, "workload certificate lifetime")
	flag.Parse()
	if *out == "" {
		fmt.Fprintln(os.Stderr, "devcerts: -out is required")
		os.Exit(2)
	}
	if err := write(*out, *trustDomain, *ns, *sa, *lifetime); err != nil {
		fmt.Fprintf(os.Stderr, "devcerts: %v\n", err)
		os.Exit(1)
	}
}

func write(dir, trustDomain, ns, sa string, lifetime time.Duration) error {
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{Organization: []string{"meshagent dev CA"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(10 * lifetime),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	leafKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	id := &url.URL{Scheme: "spiffe", Host: trustDomain, Path: fmt.Sprintf("/ns/%s/sa/%s", ns, sa)}
	leafTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		NotBefore:    now.Add(-time.Minute),
		NotAfter:     now.Add(lifetime),
		URIs:         []*url.URL{id},
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return err
	}
	leafDER, err := x509.CreateCertificate(rand.Reader, leafTmpl, ca, &leafKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(leafKey)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	files := map[string][]byte{
		"cert-chain.pem": pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: leafDER}),
		"key.pem":        pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
		"root-cert.pem":  pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
	}
	for name, data := range files {
		mode := os.FileMode(0o644)
		if name == "key.pem" {
			mode = 0o600
		}
		if err := os.WriteFile(filepath.Join(dir, name), data, mode); err != nil {
			return err
		}
	}
	return nil
}
