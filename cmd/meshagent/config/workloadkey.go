package config

import "github.com/meshagent/meshagent/services/certs"

// WorkloadKey is the workload key's settings, read at the process's first
// instruction so that the key is generated while the rest starts (#36), and
// whether a key is wanted: for `proxy` (args[0], the injector's `proxy
// sidecar`), with the certificate from a CA (FILE_MOUNTED_CERTS unset) and
// every value good. It reads ECC_SIGNATURE_ALGORITHM, WORKLOAD_RSA_KEY_SIZE
// and ECC_CURVE through the table, on r, the Reader Build reads: Build gets
// the same values, read once. A bad value is left unread, for Build to
// report, and no key is started. What it cannot know before Build (files in
// ./etc/certs, PILOT_CERT_PROVIDER=none, an external SDS server) makes a key
// that is not used: one key's CPU, once.
func WorkloadKey(r *Reader, args []string) (certs.KeySettings, bool) {
	if len(args) == 0 || args[0] != "proxy" {
		return certs.KeySettings{}, false
	}
	files, ok1 := early(r, envFileMountedCerts)
	alg, ok2 := early(r, envECCSignatureAlgorithm)
	bits, ok3 := early(r, envWorkloadRSAKeySize)
	curve, ok4 := early(r, envECCCurve)
	ks := certs.KeySettings{Algorithm: certs.KeyAlgorithm(alg), RSABits: bits, Curve: curve}
	return ks, ok1 && ok2 && ok3 && ok4 && !files
}

// early is s's value ahead of Build, and whether it is good: a good value
// is kept as read keeps it (Build's read finds it); a bad one is not read,
// so that Build's read reports it, naming the variable.
func early[T any](r *Reader, s *envVar[T]) (T, bool) {
	if text, set := r.source().Get(s.Name); set {
		if _, err := s.kind.parse(text); err != nil {
			return s.Default, false
		}
	}
	v, _, err := read(r, s)
	return v, err == nil
}
