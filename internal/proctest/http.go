package proctest

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

// Call sends method url with body (as application/json, unless it is
// empty) and, unless token is empty, the bearer token, on
// http.DefaultClient; it returns the status and the body, and fails t if
// nothing answered.
func Call(t testing.TB, method, url, token, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}
