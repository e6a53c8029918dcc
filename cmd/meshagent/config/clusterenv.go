package config

// Istio's VM bundle carries its settings as shell variable files that
// istio-start.sh sources (`set -a; . cluster.env`): cluster.env, written by
// `istioctl x workload entry configure` as KEY='value' lines, and the
// optional sidecar.env. meshagent reads them without a shell: a small
// strict parser for the subset those files use, so that a line it does not
// understand is an error naming file:line rather than a value silently
// different from the one bash would have seen.

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"regexp"
	"strings"
	"sync"
)

// envFileName is a shell variable name; compiled on first use (only `vm`
// reads an env file; #36).
var envFileName = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`) })

// readEnvFile reads a KEY=VALUE file as Istio's VM bundle writes it: blank
// lines and # comments; an optional `export `; values bare, 'single quoted'
// (literal) or "double quoted" (\" \\ \$ \` escapes). Anything a shell would
// expand ($VAR, $(...), `...`), or text after a closing quote, is refused,
// naming file:line. A later line wins over an earlier one, as in a shell.
func readEnvFile(path string) (map[string]string, error) {
	f, err := openConfigFile(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return parseEnvFile(f, path)
}

// parseEnvFile is readEnvFile's parser; name is the file's, for errors.
func parseEnvFile(r io.Reader, name string) (map[string]string, error) {
	vars := map[string]string{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		key, value, err := parseEnvLine(line)
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %w", name, n, err)
		}
		vars[key] = value
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return vars, nil
}

// parseEnvLine is one KEY=VALUE line, trimmed and not a comment.
func parseEnvLine(line string) (string, string, error) {
	line = strings.TrimPrefix(line, "export ")
	key, raw, ok := strings.Cut(line, "=")
	if !ok {
		return "", "", fmt.Errorf("%s: want KEY=VALUE", quoteValue(line))
	}
	if !envFileName().MatchString(key) {
		return "", "", fmt.Errorf("%s is not a variable name", quoteValue(key))
	}
	value, rest, err := unquoteEnvValue(raw)
	if err != nil {
		return "", "", fmt.Errorf("%s: %w", key, err)
	}
	if rest = strings.TrimSpace(rest); rest != "" && !strings.HasPrefix(rest, "#") {
		return "", "", fmt.Errorf("%s: unexpected %s after the value", key, quoteValue(rest))
	}
	return key, value, nil
}

// unquoteEnvValue reads one value from the start of raw and returns it and
// what follows it.
func unquoteEnvValue(raw string) (value, rest string, err error) {
	switch {
	case strings.HasPrefix(raw, "'"):
		end := strings.IndexByte(raw[1:], '\'')
		if end < 0 {
			return "", "", errors.New("unterminated single quote")
		}
		return raw[1 : 1+end], raw[2+end:], nil
	case strings.HasPrefix(raw, `"`):
		var b strings.Builder
		for i := 1; i < len(raw); i++ {
			switch c := raw[i]; c {
			case '"':
				return b.String(), raw[i+1:], nil
			case '\\':
				if i+1 < len(raw) && strings.IndexByte("\"\\$`", raw[i+1]) >= 0 {
					i++
					b.WriteByte(raw[i])
				} else {
					b.WriteByte(c)
				}
			case '$', '`':
				return "", "", fmt.Errorf("%s: shell expansion is not supported; quote it with '...'", quoteValue(raw))
			default:
				b.WriteByte(c)
			}
		}
		return "", "", errors.New("unterminated double quote")
	}
	value, rest, _ = strings.Cut(raw, " ")
	if strings.ContainsAny(value, "$`'\"\\;|&<>(){}") {
		return "", "", fmt.Errorf("%s: quote the value ('...') to use shell characters", quoteValue(value))
	}
	return value, rest, nil
}

// readOptionalEnvFile is readEnvFile, with a missing file read as empty
// (sidecar.env, which istio-start.sh sources only when it is readable).
func readOptionalEnvFile(path string) (map[string]string, error) {
	vars, err := readEnvFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return map[string]string{}, nil
	}
	return vars, err
}
