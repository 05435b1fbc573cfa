package deploy

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/proctest"
)

// Link-time version and commit of the binary the tests build, as a release
// build sets them.
const (
	testVersion = "0.0.0-deploytest"
	testCommit  = "0123456789abcdef0123456789abcdef01234567"
)

// root is the repository's root, the context of the image build.
var root = func() string {
	dir, err := filepath.Abs("..")
	if err != nil {
		panic(err)
	}
	return dir
}()

var binDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "sluice-deploy-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// tool is proctest.Tool: the path of the program name, which the Debian
// package pkg installs; the test is skipped without it, or failed when CI
// is set.
func tool(t testing.TB, name, pkg string) string {
	t.Helper()
	return proctest.Tool(t, name, pkg)
}

var (
	buildOnce sync.Once
	buildErr  error
)

// sluiceBinary builds sluice once per test run as the image's build stage
// does: static (CGO_ENABLED=0), stripped, with testVersion and testCommit
// linked in. It returns the binary's path.
func sluiceBinary(t testing.TB) string {
	t.Helper()
	bin := filepath.Join(binDir, "out", "sluice")
	buildOnce.Do(func() {
		cmd := proctest.BuildCommand(context.Background(), root, bin,
			"-s -w -X main.version="+testVersion+" -X main.commit="+testCommit, ".")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return bin
}

var client = &http.Client{Timeout: 10 * time.Second}

// httpGet returns the status and body of GET url, or 0 when the request
// failed.
func httpGet(url string) (int, string) {
	return do(http.MethodGet, url, "", "")
}

// do sends one request with an optional bearer token and body (JSON, as
// the admin API's writes must be).
func do(method, url, token, body string) (int, string) {
	req, err := http.NewRequestWithContext(context.Background(), method, url, strings.NewReader(body))
	if err != nil {
		return 0, err.Error()
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := client.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}
