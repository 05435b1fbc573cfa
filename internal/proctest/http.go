package proctest

import (
	"io"
	"net/http"
	"strings"
	"sync"
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
	res, b := Do(t, req)
	return res.StatusCode, b
}

// Send sends method url with no body and the header pairs (a name, then
// its value, each added) as Do does.
func Send(t testing.TB, method, url string, header ...string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Add(header[i], header[i+1])
	}
	return Do(t, req)
}

// Do sends req on http.DefaultClient; it returns the response, its body
// closed, and the body, and fails t if nothing answered.
func Do(t testing.TB, req *http.Request) (*http.Response, string) {
	t.Helper()
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res, string(b)
}

// CountStatuses runs send(0) … send(n-1) concurrently and counts the
// status codes they return; an error fails t, once every send returned.
func CountStatuses(t testing.TB, n int, send func(i int) (int, error)) map[int]int {
	t.Helper()
	var mu sync.Mutex
	codes := map[int]int{}
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			code, err := send(i)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			codes[code]++
			mu.Unlock()
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	return codes
}

// StatusOf returns the status of res, its body read to the end and closed
// so that its connection is reused, or err: it takes what a client's Do,
// Get or Post returns.
func StatusOf(res *http.Response, err error) (int, error) {
	if err != nil {
		return 0, err
	}
	io.Copy(io.Discard, res.Body) //nolint:errcheck // draining for reuse
	res.Body.Close()
	return res.StatusCode, nil
}
