package config

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/meshagent/meshagent/messages/compliance"
)

// parseFunc turns a flag's or a variable's text into a value, or says what a
// good value looks like. A flag and the variable that stands in for it go
// through the same one.
type parseFunc[T any] func(string) (T, error)

func parseString(s string) (string, error) { return s, nil }

// kind is how a variable's text becomes a value of T (the parser a flag
// bound to the variable shares), and how help names its type.
type kind[T any] struct {
	name  string
	parse parseFunc[T]
	// zero, when set, is how help shows the zero value ("0 (off)").
	zero string
}

// format is a default as help prints it: "-" for an empty text, a
// duration in its shortest form (24h, not 24h0m0s).
func (k kind[T]) format(v T) string {
	var zero T
	if k.zero != "" && any(v) == any(zero) {
		return k.zero
	}
	switch x := any(v).(type) {
	case string:
		if x == "" {
			return "-"
		}
		return x
	case time.Duration:
		s := x.String()
		if strings.HasSuffix(s, "m0s") {
			s = strings.TrimSuffix(s, "0s")
		}
		if strings.HasSuffix(s, "h0m") {
			s = strings.TrimSuffix(s, "0m")
		}
		return s
	case float64:
		return strconv.FormatFloat(x, 'g', -1, 64)
	}
	return fmt.Sprint(v)
}

// The kinds of the table's entries.
var (
	asBool      = kind[bool]{name: "bool", parse: parseBool}
	asDuration  = kind[time.Duration]{name: "duration", parse: parseDuration}
	asPort      = kind[int]{name: "port", parse: parsePort}
	asPortOrOff = kind[int]{name: "port or 0", parse: parsePortOrOff, zero: "0 (off)"}
	asCount     = kind[int]{name: "count", parse: parseCount}
	// asPositive and asPositiveCount are a duration and a count where 0
	// means nothing a service can do (a fetch with no attempt, no time):
	// refused, naming the variable, not a silent default (#34).
	asPositive         = kind[time.Duration]{name: "duration > 0", parse: positive(parseDuration)}
	asPositiveCount    = kind[int]{name: "count > 0", parse: positive(parseCount)}
	asNumber           = kind[float64]{name: "number", parse: parseFloat}
	asDNSLabel         = kind[string]{name: "DNS label", parse: parseDNSLabel}
	asDNSSubdomain     = kind[string]{name: "DNS subdomain", parse: parseDNSSubdomain}
	asPodName          = kind[string]{name: "pod name", parse: parsePodName}
	asCompliancePolicy = kind[compliance.Policy]{name: "fips-140-2, fips-140-3 or pqc", parse: compliance.Parse, zero: "-"}
	asTrustDomain      = kind[string]{name: "trust domain", parse: parseTrustDomain}
	asKeyAlgorithm     = kind[string]{name: "ECDSA or RSA", parse: parseKeyAlgorithm}
	asECCCurve         = kind[string]{name: "P256 or P384", parse: parseECCCurve}
	asGCPercent        = kind[int]{name: "count or off", parse: parseGCPercent}
	asMemoryLimitRatio = kind[float64]{name: "ratio or off", parse: parseMemoryLimitRatio}
	asHostPort         = kind[string]{name: "host:port", parse: parseHostPort}
	asIP               = kind[string]{name: "IP", parse: parseIP}
	// asOptionalPort is a port that is none when unset.
	asOptionalPort = kind[int]{name: "port", parse: parsePort, zero: "-"}
)

// asText is a variable taken as it is; name is its type as help says it
// ("path", "host:port").
func asText(name string) kind[string] { return kind[string]{name: name, parse: parseString} }

// positive is parse, refusing 0.
func positive[T int | time.Duration](parse parseFunc[T]) parseFunc[T] {
	return func(s string) (T, error) {
		v, err := parse(s)
		if err == nil && v == 0 {
			err = errors.New("want more than 0")
		}
		return v, err
	}
}

// parseMemoryLimitRatio is AUTOMEMLIMIT as automemlimit reads it (#36): a
// share of the cgroup's limit in (0, 1], or off (0).
func parseMemoryLimitRatio(s string) (float64, error) {
	if strings.TrimSpace(s) == "off" {
		return 0, nil
	}
	f, err := parseFloat(s)
	if err != nil || !(f > 0 && f <= 1) {
		return 0, errors.New(`want a ratio in (0, 1], or "off"`)
	}
	return f, nil
}

// parseGCPercent is GOGC as Go's runtime reads it: a percentage, or off.
func parseGCPercent(s string) (int, error) {
	if s == "off" {
		return -1, nil
	}
	return parseCount(s)
}

func parseBool(s string) (bool, error) {
	b, err := strconv.ParseBool(strings.TrimSpace(s))
	if err != nil {
		return false, errors.New("want true or false")
	}
	return b, nil
}

// parseCount is a whole number, 0 or more.
func parseCount(s string) (int, error) {
	n, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil || n < 0 {
		return 0, errors.New("want a whole number, 0 or more")
	}
	return n, nil
}

// parsePort is a TCP/UDP port, 1-65535.
func parsePort(s string) (int, error) {
	n, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil || n < 1 || n > math.MaxUint16 {
		return 0, errors.New("want a port, 1-65535")
	}
	return n, nil
}

// parseDuration is a Go duration, 0 or more ("5s", "100ms").
func parseDuration(s string) (time.Duration, error) {
	d, err := time.ParseDuration(strings.TrimSpace(s))
	if err != nil || d < 0 {
		return 0, errors.New("want a duration such as 5s")
	}
	return d, nil
}

func parseFloat(s string) (float64, error) {
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

// Compiled on first use rather than at start: a package-level regexp is
// live heap in every pod, used or not (#36).
var (
	trustDomainChars = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z0-9._-]+$`) })
	dnsLabel         = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`) })
)

// parseTrustDomain is a SPIFFE trust domain: lowercase letters, digits,
// dots, dashes and underscores, at most 255 bytes.
func parseTrustDomain(s string) (string, error) {
	if len(s) > maxTrustDomain || !trustDomainChars().MatchString(s) {
		return "", fmt.Errorf("want a SPIFFE trust domain: lowercase letters, digits, '.', '-' and '_', at most %d bytes", maxTrustDomain)
	}
	return s, nil
}

// parseDNSLabel is a Kubernetes namespace name: a DNS-1123 label.
func parseDNSLabel(s string) (string, error) {
	if len(s) > maxDNSLabel || !dnsLabel().MatchString(s) {
		return "", fmt.Errorf("want a Kubernetes namespace name (DNS-1123 label): lowercase letters, digits and '-', starting and ending with a letter or digit, at most %d bytes", maxDNSLabel)
	}
	return s, nil
}

// parseDNSSubdomain is a Kubernetes service account name: a DNS-1123
// subdomain, labels joined by dots.
func parseDNSSubdomain(s string) (string, error) {
	bad := len(s) > maxDNSSubdomain
	for _, label := range strings.Split(s, ".") {
		bad = bad || !dnsLabel().MatchString(label)
	}
	if bad {
		return "", fmt.Errorf("want a Kubernetes service account name (DNS-1123 subdomain): dot-separated labels of lowercase letters, digits and '-', at most %d bytes", maxDNSSubdomain)
	}
	return s, nil
}

// parsePodName is POD_NAME, a Kubernetes pod name: a DNS-1123 subdomain,
// as the API server checks it (#33: 100 KB, or unicode, went into the
// node id, Envoy's metadata and every xDS request).
func parsePodName(s string) (string, error) {
	if _, err := parseDNSSubdomain(s); err != nil {
		return "", fmt.Errorf("want a Kubernetes pod name (DNS-1123 subdomain): dot-separated labels of lowercase letters, digits and '-', at most %d bytes", maxDNSSubdomain)
	}
	return s, nil
}

// parseKeyAlgorithm is ECC_SIGNATURE_ALGORITHM. Istio's agent compares the
// value with "ECDSA" and makes an RSA key for anything else, so a typo
// ("ecdsa", "EC") silently gave RSA; RSA, the default, may be named.
func parseKeyAlgorithm(s string) (string, error) {
	if s != "ECDSA" && s != "RSA" {
		return "", errors.New("want ECDSA (or RSA, the default when unset); the value is case-sensitive, as in Istio")
	}
	return s, nil
}

// parseECCCurve is ECC_CURVE: Istio's two curves (it takes anything else
// for P256 without a word).
func parseECCCurve(s string) (string, error) {
	if s != "P256" && s != "P384" {
		return "", errors.New("want P256 or P384")
	}
	return s, nil
}

// parseHostPort is an address: a host (a name or an IP) and a port,
// 1-65535 ("localhost:15053", "[::1]:15053").
func parseHostPort(s string) (string, error) {
	_, port, err := net.SplitHostPort(s)
	if err == nil {
		_, err = parsePort(port)
	}
	if err != nil {
		return "", errors.New("want host:port, the port 1-65535")
	}
	return s, nil
}

// parseIP is an IPv4 or IPv6 address.
func parseIP(s string) (string, error) {
	ip, err := netip.ParseAddr(strings.TrimSpace(s))
	if err != nil {
		return "", errors.New("want an IP address")
	}
	return ip.String(), nil
}

// parsePortOrOff is a port, or 0 for none.
func parsePortOrOff(s string) (int, error) {
	if s == "0" {
		return 0, nil
	}
	return parsePort(s)
}

// maxShownValue bounds how much of a bad value an error repeats: a 100 KB
// variable must not become a 100 KB error line (#21). The start and the end
// are kept, where a path or a suffix usually says what went wrong.
const maxShownValue = 120

// quoteValue is a flag's or a variable's text as an error shows it: quoted,
// and cut in the middle when long, with its length.
func quoteValue(s string) string {
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
	return 0, fmt.Errorf("--log_output_level %s: level %s is not one of debug, info, warn, error, fatal, none", quoteValue(spec), quoteValue(level))
}
