package config

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// Parser turns a flag's or a variable's text into a value, or says what a
// good value looks like. A flag and the variable that stands in for it go
// through the same one.
type Parser[T any] func(string) (T, error)

func ParseString(s string) (string, error) { return s, nil }

func ParseBool(s string) (bool, error) {
	b, err := strconv.ParseBool(strings.TrimSpace(s))
	if err != nil {
		return false, errors.New("want true or false")
	}
	return b, nil
}

// ParseCount is a whole number, 0 or more.
func ParseCount(s string) (int, error) {
	n, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil || n < 0 {
		return 0, errors.New("want a whole number, 0 or more")
	}
	return n, nil
}

// ParsePort is a TCP/UDP port, 1-65535.
func ParsePort(s string) (int, error) {
	n, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil || n < 1 || n > math.MaxUint16 {
		return 0, errors.New("want a port, 1-65535")
	}
	return n, nil
}

// ParseDuration is a Go duration, 0 or more ("5s", "100ms").
func ParseDuration(s string) (time.Duration, error) {
	d, err := time.ParseDuration(strings.TrimSpace(s))
	if err != nil || d < 0 {
		return 0, errors.New("want a duration such as 5s")
	}
	return d, nil
}

func ParseFloat(s string) (float64, error) {
	f, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err != nil {
		return 0, errors.New("want a number")
	}
	return f, nil
}

// The parts of the SPIFFE ID (spiffe://TRUST_DOMAIN/ns/POD_NAMESPACE/sa/
// SERVICE_ACCOUNT) are checked where they are read: Istio's agent takes any
// text, so a unicode or 100 KB value went into the CSR and the CA's refusal
// came back as a retry loop (#21). The rules are SPIFFE's for the trust
// domain and Kubernetes' for the names a pod can have.
const (
	maxTrustDomain  = 255 // SPIFFE: a trust domain is at most 255 bytes
	maxDNSLabel     = 63  // Kubernetes: a namespace is a DNS-1123 label
	maxDNSSubdomain = 253 // Kubernetes: a service account is a DNS-1123 subdomain
)

var (
	trustDomainChars = regexp.MustCompile(`^[a-z0-9._-]+$`)
	dnsLabel         = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
)

// ParseTrustDomain is a SPIFFE trust domain: lowercase letters, digits,
// dots, dashes and underscores, at most 255 bytes.
func ParseTrustDomain(s string) (string, error) {
	if len(s) > maxTrustDomain || !trustDomainChars.MatchString(s) {
		return "", fmt.Errorf("want a SPIFFE trust domain: lowercase letters, digits, '.', '-' and '_', at most %d bytes", maxTrustDomain)
	}
	return s, nil
}

// ParseDNSLabel is a Kubernetes namespace name: a DNS-1123 label.
func ParseDNSLabel(s string) (string, error) {
	if len(s) > maxDNSLabel || !dnsLabel.MatchString(s) {
		return "", fmt.Errorf("want a Kubernetes namespace name (DNS-1123 label): lowercase letters, digits and '-', starting and ending with a letter or digit, at most %d bytes", maxDNSLabel)
	}
	return s, nil
}

// ParseDNSSubdomain is a Kubernetes service account name: a DNS-1123
// subdomain, labels joined by dots.
func ParseDNSSubdomain(s string) (string, error) {
	bad := len(s) > maxDNSSubdomain
	for _, label := range strings.Split(s, ".") {
		bad = bad || !dnsLabel.MatchString(label)
	}
	if bad {
		return "", fmt.Errorf("want a Kubernetes service account name (DNS-1123 subdomain): dot-separated labels of lowercase letters, digits and '-', at most %d bytes", maxDNSSubdomain)
	}
	return s, nil
}

// ParsePodName is POD_NAME, a Kubernetes pod name: a DNS-1123 subdomain,
// as the API server checks it (#33: 100 KB, or unicode, went into the
// node id, Envoy's metadata and every xDS request).
func ParsePodName(s string) (string, error) {
	if _, err := ParseDNSSubdomain(s); err != nil {
		return "", fmt.Errorf("want a Kubernetes pod name (DNS-1123 subdomain): dot-separated labels of lowercase letters, digits and '-', at most %d bytes", maxDNSSubdomain)
	}
	return s, nil
}

// ParseKeyAlgorithm is ECC_SIGNATURE_ALGORITHM. Istio's agent compares the
// value with "ECDSA" and makes an RSA key for anything else, so a typo
// ("ecdsa", "EC") silently gave RSA; RSA, the default, may be named.
func ParseKeyAlgorithm(s string) (string, error) {
	if s != "ECDSA" && s != "RSA" {
		return "", errors.New("want ECDSA (or RSA, the default when unset); the value is case-sensitive, as in Istio")
	}
	return s, nil
}

// ParseECCCurve is ECC_CURVE: Istio's two curves (it takes anything else
// for P256 without a word).
func ParseECCCurve(s string) (string, error) {
	if s != "P256" && s != "P384" {
		return "", errors.New("want P256 or P384")
	}
	return s, nil
}

// ParsePortOrOff is a port, or 0 for none.
func ParsePortOrOff(s string) (int, error) {
	if s == "0" {
		return 0, nil
	}
	return ParsePort(s)
}

// maxShownValue bounds how much of a bad value an error repeats: a 100 KB
// variable must not become a 100 KB error line (#21). The start and the end
// are kept, where a path or a suffix usually says what went wrong.
const maxShownValue = 120

// QuoteValue is a flag's or a variable's text as an error shows it: quoted,
// and cut in the middle when long, with its length.
func QuoteValue(s string) string {
	if len(s) <= maxShownValue {
		return strconv.Quote(s)
	}
	const tail = maxShownValue / 4
	return fmt.Sprintf("%s…%s (%d bytes)", strconv.Quote(s[:maxShownValue-tail]), strconv.Quote(s[len(s)-tail:]), len(s))
}

// ParseLogLevel takes the level of the "default" scope (or of a bare level).
// Istio's levels: debug, info, warn, error, fatal, none.
func ParseLogLevel(spec string) (slog.Level, error) {
	level := "info"
	for _, part := range strings.Split(spec, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		scope, lvl, scoped := strings.Cut(part, ":")
		if !scoped {
			level = scope
		} else if scope == "default" {
			level = lvl
		}
	}
	switch level {
	case "debug":
		return slog.LevelDebug, nil
	case "info":
		return slog.LevelInfo, nil
	case "warn", "warning":
		return slog.LevelWarn, nil
	case "error", "fatal":
		return slog.LevelError, nil
	case "none":
		return slog.LevelError + 100, nil
	}
	return 0, fmt.Errorf("--log_output_level %s: level %s is not one of debug, info, warn, error, fatal, none", QuoteValue(spec), QuoteValue(level))
}
