package proctest

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
)

// Scrape reads the Prometheus exposition at url (a /metrics) with c into
// series → value (see ParseMetrics), failing t unless it answers 200.
func Scrape(t testing.TB, c *http.Client, url string) map[string]float64 {
	t.Helper()
	res, err := c.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(res.Body)
		t.Fatalf("GET %s: %d %s", url, res.StatusCode, b)
	}
	m, err := ParseMetrics(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// ParseMetrics reads a Prometheus text exposition into series → value,
// each series written as in the exposition, e.g.
// sluice_store_errors_total{kind="timeout"}.
func ParseMetrics(r io.Reader) (map[string]float64, error) {
	m := map[string]float64{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			return nil, fmt.Errorf("metrics line %q: %v", line, err)
		}
		m[line[:i]] = v
	}
	return m, sc.Err()
}
