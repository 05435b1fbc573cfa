package deploy

import (
	"archive/tar"
	"bytes"
	"crypto/rand"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/pgtest"
	"github.com/sluicehq/sluice/internal/proctest"
)

// maxImageBytes bounds the image: a static binary and a certificate bundle.
const maxImageBytes = 40 << 20

// drain is sluice's longest wait for in-flight requests after SIGTERM.
const drain = 25 * time.Second

// podman runs podman on a private storage (so that tests leave no images
// behind and never meet another run's) the way it works on machines
// without systemd: runc, cgroupfs, events in a file, and a containers.conf
// without default ulimits.
type podman struct {
	t    *testing.T
	bin  string
	args []string
	env  []string
}

func newPodman(t *testing.T) *podman {
	bin := tool(t, "podman", "podman")
	tool(t, "runc", "runc")
	dir := t.TempDir()
	conf := filepath.Join(dir, "containers.conf")
	if err := os.WriteFile(conf, []byte("[containers]\ndefault_ulimits = []\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	p := &podman{t: t, bin: bin,
		args: []string{
			"--root", filepath.Join(dir, "root"), "--runroot", filepath.Join(dir, "run"),
			"--runtime", "runc", "--cgroup-manager=cgroupfs", "--events-backend=file",
		},
		env: append(os.Environ(), "CONTAINERS_CONF="+conf),
	}
	// Before t.TempDir's removal (cleanups run last first): unmount and
	// delete everything in the private storage.
	t.Cleanup(func() { p.run("system", "reset", "--force") }) //nolint:errcheck // best effort
	return p
}

// run runs podman with args and returns its standard output.
func (p *podman) run(args ...string) (string, error) {
	cmd := exec.Command(p.bin, append(slices.Clone(p.args), args...)...)
	cmd.Env = p.env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err != nil {
		err = fmt.Errorf("podman %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String(), err
}

// must is run failing the test on an error.
func (p *podman) must(args ...string) string {
	p.t.Helper()
	out, err := p.run(args...)
	if err != nil {
		p.t.Fatal(err)
	}
	return out
}

// TestContainerImage builds deploy/Dockerfile with podman and runs it: the
// image is small, static, shell-less and non-root; a request through the
// container reaches an upstream until the limit answers 429; its health
// check passes; and podman stop ends it well within the drain.
//
// No registry is reachable from the test machines, so the build stage's
// outputs (the static binary, the CA bundle) come from a directory through
// --build-context build=DIR, built here as that stage builds them; the
// final stage, FROM scratch, needs no image at all.
func TestContainerImage(t *testing.T) {
	t.Parallel()
	p := newPodman(t)
	stage := t.TempDir()
	link(t, sluiceBinary(t), filepath.Join(stage, "out", "sluice"))
	link(t, "/etc/ssl/certs/ca-certificates.crt", filepath.Join(stage, "etc", "ssl", "certs", "ca-certificates.crt"))

	var suffix [6]byte
	rand.Read(suffix[:])
	image := "localhost/sluice-deploytest:" + hex.EncodeToString(suffix[:])
	began := time.Now()
	p.must("build", "--format", "docker", "--build-context", "build="+stage,
		"--build-arg", "VERSION="+testVersion, "--build-arg", "COMMIT="+testCommit,
		"-f", filepath.Join(root, "deploy", "Dockerfile"), "-t", image, root)
	t.Logf("image built in %s", time.Since(began).Round(time.Millisecond))

	checkImageConfig(t, p, image)
	checkImageFiles(t, p, image)

	upstream := proctest.NewUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "hello from upstream")
	})
	// The host's network, so that the container reaches the test's
	// upstream on loopback and the test reaches the container's ports.
	// The public listener is given port 0: the kernel picks a port nothing
	// else holds, and the container logs it. The admin listener needs a
	// port known beforehand, which the image's HEALTHCHECK (sluice
	// healthcheck, reading SLUICE_ADMIN_LISTEN) asks; if another process
	// took it meanwhile, the container is started again on another.
	var name, public, admin string
	var logs func() string
	for attempt := 1; ; attempt++ {
		name = fmt.Sprintf("sluice-deploytest-%s-%d", hex.EncodeToString(suffix[:]), attempt)
		p.must("run", "--detach", "--name", name, "--network=host",
			"--env", "SLUICE_UPSTREAM="+upstream.URL,
			"--env", "SLUICE_LISTEN=127.0.0.1:0",
			"--env", "SLUICE_ADMIN_LISTEN="+proctest.FreeAddr(t),
			"--env", "SLUICE_RULES=hello: GET /hello by ip 3/1h",
			image)
		t.Cleanup(func() { p.run("rm", "--force", "--time", "0", name) }) //nolint:errcheck // may be gone
		logs = func() string {
			// podman logs writes the container's standard error to its own.
			out, _ := proctest.Run("", p.env, p.bin, append(slices.Clone(p.args), "logs", name)...)
			return out
		}
		// "sluice started" names every listener once all are open.
		var out string
		public, admin, out = containerListeners(logs, 20*time.Second)
		if public != "" {
			break
		}
		if !strings.Contains(out, "address already in use") || attempt == 3 {
			t.Fatalf("the container has not logged its listeners within 20s\n%s", out)
		}
	}
	if code, _ := httpGet("http://" + admin + "/healthz"); code != http.StatusOK {
		t.Fatalf("the container's /healthz: %d\n%s", code, logs())
	}
	base := "http://" + public

	pgtest.ClearOf(t, time.Hour, 10*time.Second)
	for i := 1; i <= 3; i++ {
		if code, body := httpGet(base + "/hello"); code != http.StatusOK || body != "hello from upstream" {
			t.Fatalf("request %d through the container: %d %q", i, code, body)
		}
	}
	res, err := client.Get(base + "/hello")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusTooManyRequests || res.Header.Get("Retry-After") == "" {
		t.Fatalf("4th request: %d, Retry-After %q; want 429 with Retry-After", res.StatusCode, res.Header.Get("Retry-After"))
	}
	if n := upstream.Hits(); n != 3 {
		t.Fatalf("the upstream saw %d requests, want 3", n)
	}

	// The image's HEALTHCHECK, run as the runtime runs it: inside the
	// container, without a shell.
	if _, err := p.run("healthcheck", "run", name); err != nil {
		t.Errorf("podman healthcheck run: %v", err)
	}
	var health struct {
		Status string
		Log    []struct{ Output string }
	}
	json.Unmarshal([]byte(p.must("inspect", "--format", "{{json .State.Health}}", name)), &health) //nolint:errcheck // checked below
	if health.Status != "healthy" || len(health.Log) == 0 || !strings.Contains(health.Log[len(health.Log)-1].Output, "healthy: GET http://127.0.0.1:") {
		t.Errorf("health after the check: %+v", health)
	}

	pid := strings.TrimSpace(p.must("inspect", "--format", "{{.State.Pid}}", name))
	status, err := os.ReadFile("/proc/" + pid + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if field, ids, ok := strings.Cut(line, ":"); ok && (field == "Uid" || field == "Gid") {
			for _, id := range strings.Fields(ids) {
				if id != "65532" {
					t.Errorf("the container's process runs with %s %s, want 65532 throughout", field, strings.TrimSpace(ids))
					break
				}
			}
		}
	}

	began = time.Now()
	p.must("stop", "--time", strconv.Itoa(int(drain/time.Second)+5), name)
	took := time.Since(began)
	code := strings.TrimSpace(p.must("inspect", "--format", "{{.State.ExitCode}}", name))
	t.Logf("podman stop took %s, exit code %s", took.Round(time.Millisecond), code)
	if took >= drain || code != "0" {
		t.Fatalf("podman stop took %s and the exit code is %s; want a clean exit (0) within the %s drain\n%s", took, code, drain, logs())
	}
	if !strings.Contains(logs(), "sluice stopped") {
		t.Errorf("no \"sluice stopped\" in the logs:\n%s", logs())
	}
}

// checkImageConfig checks what the image declares: user, ports, health
// check, entry point, labels and size.
func checkImageConfig(t *testing.T, p *podman, image string) {
	t.Helper()
	type healthcheck struct{ Test []string }
	var inspected []struct {
		Size   int64
		Config struct {
			User         string
			ExposedPorts map[string]any
			Entrypoint   []string
			Labels       map[string]string
			StopSignal   string
			Healthcheck  *healthcheck // where docker puts it
		}
		Healthcheck *healthcheck // where podman puts it
	}
	if err := json.Unmarshal([]byte(p.must("image", "inspect", image)), &inspected); err != nil || len(inspected) != 1 {
		t.Fatalf("podman image inspect: %v", err)
	}
	img := inspected[0]
	t.Logf("image size %.1f MB", float64(img.Size)/1e6)
	if img.Size >= maxImageBytes {
		t.Errorf("image is %d bytes, want under %d", img.Size, maxImageBytes)
	}
	c := img.Config
	if c.User != "65532:65532" {
		t.Errorf("USER %q, want 65532:65532", c.User)
	}
	for _, port := range []string{"8080/tcp", "9090/tcp"} {
		if _, ok := c.ExposedPorts[port]; !ok {
			t.Errorf("port %s not exposed: %v", port, c.ExposedPorts)
		}
	}
	if !slices.Equal(c.Entrypoint, []string{"/sluice"}) {
		t.Errorf("ENTRYPOINT %q", c.Entrypoint)
	}
	hc := c.Healthcheck
	if hc == nil {
		hc = img.Healthcheck
	}
	if hc == nil || !slices.Equal(hc.Test, []string{"CMD", "/sluice", "healthcheck"}) {
		t.Errorf("HEALTHCHECK %v, want the exec form of /sluice healthcheck", hc)
	}
	if c.StopSignal != "SIGTERM" && c.StopSignal != "15" {
		t.Errorf("STOPSIGNAL %q", c.StopSignal)
	}
	if c.Labels["org.opencontainers.image.version"] != testVersion || c.Labels["org.opencontainers.image.revision"] != testCommit {
		t.Errorf("labels %v: want the VERSION and COMMIT build arguments", c.Labels)
	}
	// The binary reports what was linked into it.
	out := p.must("run", "--rm", "--network=none", image, "version")
	if want := "sluice " + testVersion + ", commit " + testCommit + ", go"; !strings.HasPrefix(out, want) {
		t.Errorf("sluice version in the image: %q, want it to start with %q", out, want)
	}
}

// checkImageFiles checks the image's file system: the binary and the CA
// bundle, nothing else (no shell), and the binary static.
func checkImageFiles(t *testing.T, p *podman, image string) {
	t.Helper()
	ctr := strings.TrimSpace(p.must("create", image))
	defer p.run("rm", ctr) //nolint:errcheck // best effort
	tarball := filepath.Join(t.TempDir(), "fs.tar")
	p.must("export", "--output", tarball, ctr)
	f, err := os.Open(tarball)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var files []string
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeDir {
			continue
		}
		files = append(files, h.Name)
		if h.Name == "sluice" {
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			checkStatic(t, b)
		}
	}
	slices.Sort(files)
	// Container runtimes add mount points and /etc files at run time;
	// the image itself holds only these.
	if want := []string{"etc/ssl/certs/ca-certificates.crt", "sluice"}; !slices.Equal(files, want) {
		t.Errorf("image files %q, want exactly %q (no shell, nothing else)", files, want)
	}
}

// checkStatic fails t unless the ELF image b is statically linked: no
// program interpreter and no shared libraries.
func checkStatic(t *testing.T, b []byte) {
	t.Helper()
	f, err := elf.NewFile(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("/sluice: %v", err)
	}
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			t.Error("/sluice has a program interpreter: not static")
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
		t.Errorf("/sluice needs shared libraries %q: not static", libs)
	}
}

// link makes a hard link (or a copy, across file systems) of src at dst.
func link(t *testing.T, src, dst string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		t.Fatal(err)
	}
	if os.Link(src, dst) == nil {
		return
	}
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatalf("%v (the image needs it)", err)
	}
	if err := os.WriteFile(dst, b, 0o755); err != nil {
		t.Fatal(err)
	}
}

// containerListeners reads a container's log (logs) until it names its
// public and admin listeners, or until limit, or until it says a listener
// could not open; it returns the addresses ("" when not named) and the log.
func containerListeners(logs func() string, limit time.Duration) (public, admin, out string) {
	deadline := time.Now().Add(limit)
	for {
		out = logs()
		b := &proctest.Buffer{}
		b.Write([]byte(out)) //nolint:errcheck // a Buffer never fails
		public = proctest.LoggedAddr(b, "listen", nil, 0)
		admin = proctest.LoggedAddr(b, "admin_listen", nil, 0)
		if public != "" && admin != "" || strings.Contains(out, "address already in use") || time.Now().After(deadline) {
			return public, admin, out
		}
		time.Sleep(50 * time.Millisecond) // start-up is an external event: poll it
	}
}
