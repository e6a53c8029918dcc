package config

import (
	"errors"
	"fmt"
	"math"
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
