package deploy

import (
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
)

// composeFile is the part of `docker-compose config`'s output the test
// reads.
type composeFile struct {
	Services map[string]struct {
		Image string
		Build *struct {
			Context    string
			Dockerfile string
		}
		DependsOn map[string]struct {
			Condition string
		} `json:"depends_on"`
		Environment     map[string]string
		Ports           []any
		ReadOnly        bool     `json:"read_only"`
		CapDrop         []string `json:"cap_drop"`
		SecurityOpt     []string `json:"security_opt"`
		StopGracePeriod string   `json:"stop_grace_period"`
		Healthcheck     *struct{ Test []string }
	}
}

// TestCompose validates deploy/compose.yaml with docker-compose config, then
// checks what the quickstart relies on: sluice built from deploy/Dockerfile,
// started once Postgres is healthy, pointed at the compose file's own
// Postgres and upstream, its admin port on loopback only, hardened, given
// more than the drain to stop, and with settings and rules that sluice
// accepts. Running it needs images from a registry, which the test
// machines cannot reach.
func TestCompose(t *testing.T) {
	t.Parallel()
	bin := tool(t, "docker-compose", "docker-compose")
	cmd := exec.Command(bin, "--file", filepath.Join(root, "deploy", "compose.yaml"), "config")
	// Without the caller's settings: the placeholders' defaults apply.
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir()}
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("docker-compose config: %v\n%s", err, stderr)
	}
	var c composeFile
	if err := yaml.Unmarshal(out, &c); err != nil {
		t.Fatalf("docker-compose config's output: %v\n%s", err, out)
	}
	pg, ok1 := c.Services["postgres"]
	up, ok2 := c.Services["upstream"]
	s, ok3 := c.Services["sluice"]
	if !ok1 || !ok2 || !ok3 {
		t.Fatalf("services %v, want postgres, upstream and sluice", c.Services)
	}
	if s.Build == nil || s.Build.Context != root || s.Build.Dockerfile != "deploy/Dockerfile" {
		t.Errorf("sluice's build %+v: want deploy/Dockerfile with the repository as context", s.Build)
	}
	if s.DependsOn["postgres"].Condition != "service_healthy" || pg.Healthcheck == nil {
		t.Errorf("sluice must wait for a healthy postgres: depends_on %v, postgres healthcheck %v", s.DependsOn, pg.Healthcheck)
	}
	if _, ok := s.DependsOn["upstream"]; !ok || up.Image == "" {
		t.Errorf("sluice must start after the upstream: depends_on %v", s.DependsOn)
	}

	env := s.Environment
	if u, err := url.Parse(env["SLUICE_UPSTREAM"]); err != nil || u.Hostname() != "upstream" {
		t.Errorf("SLUICE_UPSTREAM %q: want the upstream service", env["SLUICE_UPSTREAM"])
	}
	db, err := url.Parse(env["SLUICE_DATABASE_URL"])
	if err != nil {
		t.Fatalf("SLUICE_DATABASE_URL: %v", err)
	}
	password, _ := db.User.Password()
	if db.Hostname() != "postgres" || db.User.Username() != pg.Environment["POSTGRES_USER"] ||
		password != pg.Environment["POSTGRES_PASSWORD"] || strings.TrimPrefix(db.Path, "/") != pg.Environment["POSTGRES_DB"] {
		t.Errorf("SLUICE_DATABASE_URL does not match the postgres service's user, password and database")
	}
	for _, k := range []string{"SLUICE_HASH_KEY", "SLUICE_ADMIN_TOKEN", "POSTGRES_PASSWORD"} {
		v := env[k]
		if k == "POSTGRES_PASSWORD" {
			v = pg.Environment[k]
		}
		if !strings.HasPrefix(v, "placeholder-") {
			t.Errorf("%s defaults to %q: a committed value must be an obvious placeholder", k, v)
		}
	}

	// Public port from anywhere, admin port on loopback only.
	var published []string
	for _, p := range s.Ports {
		switch p := p.(type) {
		case string:
			published = append(published, p)
		case map[string]any:
			hostIP, _ := p["host_ip"].(string)
			published = append(published, strings.TrimPrefix(hostIP+":", ":")+num(p["published"])+":"+num(p["target"]))
		}
	}
	if !slices.Contains(published, "8080:8080") || !slices.ContainsFunc(published, func(p string) bool { return strings.HasPrefix(p, "127.0.0.1:9090:9090") }) ||
		len(published) != 2 {
		t.Errorf("ports %q: want 8080:8080 and 127.0.0.1:9090:9090", published)
	}
	if !s.ReadOnly || !slices.Equal(s.CapDrop, []string{"ALL"}) || !slices.Contains(s.SecurityOpt, "no-new-privileges:true") {
		t.Errorf("sluice not hardened: read_only %v, cap_drop %v, security_opt %v", s.ReadOnly, s.CapDrop, s.SecurityOpt)
	}
	if grace, err := time.ParseDuration(s.StopGracePeriod); err != nil || grace <= drain {
		t.Errorf("stop_grace_period %q: want more than the %s drain", s.StopGracePeriod, drain)
	}

	// The settings and rules are ones sluice accepts.
	check := exec.Command(sluiceBinary(t), "check-config")
	check.Env = []string{"PATH=" + os.Getenv("PATH")}
	for k, v := range env {
		check.Env = append(check.Env, k+"="+v)
	}
	if out, err := check.CombinedOutput(); err != nil {
		t.Errorf("sluice check-config with the compose file's environment: %v\n%s", err, out)
	}
}

// num formats a number decoded from JSON (or a string) for a port spec.
func num(v any) string {
	switch v := v.(type) {
	case float64:
		return strconv.FormatFloat(v, 'f', -1, 64)
	case string:
		return v
	}
	return ""
}
