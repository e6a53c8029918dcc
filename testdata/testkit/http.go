package testkit

import (
	"io"
	"net/http"
	"testing"
)

// Fetch sends one request without a body to url and returns the answer's
// status and body. A request that fails is status 0 with the error as the
// body, so that a wait may poll a server that is not up yet and a test
// may show why.
func Fetch(method, url string) (code int, body string) {
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		return 0, err.Error()
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err.Error()
	}
	return resp.StatusCode, string(b)
}

// MustFetch is Fetch for a server that must answer: the test fails when
// the request does.
func MustFetch(t testing.TB, method, url string) (code int, body string) {
	t.Helper()
	code, body = Fetch(method, url)
	if code == 0 {
		t.Fatalf("%s %s: %s", method, url, body)
	}
	return code, body
}
