package deploy

import (
	"net"
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"sigs.k8s.io/yaml"

	"github.com/sluicehq/sluice/internal/proctest"
)

// composeFile is the part of `docker-compose config`'s output the tests
// read.
type composeFile struct {
	Services map[string]composeService
}

type composeService struct {
	Image string
	Build *struct {
		Context    string
		Dockerfile string
	}
	User       string
	Entrypoint []string
	Command    []string
	DependsOn  map[string]struct {
		Condition string
	} `json:"depends_on"`
	Environment     map[string]string
	Volumes         []any // "source:target:mode", or the long form
	Ports           []any
	ReadOnly        bool     `json:"read_only"`
	CapDrop         []string `json:"cap_drop"`
	SecurityOpt     []string `json:"security_opt"`
	StopGracePeriod string   `json:"stop_grace_period"`
	Healthcheck     *struct{ Test []string }
}

// composeConfig runs docker-compose config on deploy/compose.yaml without
// the caller's settings (so the placeholders' defaults apply) and decodes
// its output.
func composeConfig(t *testing.T) composeFile {
	t.Helper()
	bin := tool(t, "docker-compose", "docker-compose")
	cmd := exec.Command(bin, "--file", filepath.Join(root, "deploy", "compose.yaml"), "config")
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
	return c
}

// mount is one of a service's volumes: a named volume, or a file or
// directory of this machine (bind).
type mount struct {
	Source, Target string
	Bind, ReadOnly bool
}

// mounts decodes a service's volumes, in either of the forms
// docker-compose config writes (v1 strings, v2 maps).
func (s composeService) mounts(t *testing.T) []mount {
	t.Helper()
	var ms []mount
	for _, v := range s.Volumes {
		switch v := v.(type) {
		case string:
			parts := strings.Split(v, ":")
			if len(parts) < 2 {
				t.Fatalf("volume %q: want source:target[:mode]", v)
			}
			m := mount{Source: parts[0], Target: parts[1]}
			m.Bind = filepath.IsAbs(m.Source)
			m.ReadOnly = len(parts) > 2 && slices.Contains(strings.Split(parts[2], ","), "ro")
			ms = append(ms, m)
		case map[string]any:
			source, _ := v["source"].(string)
			target, _ := v["target"].(string)
			kind, _ := v["type"].(string)
			readOnly, _ := v["read_only"].(bool)
			ms = append(ms, mount{Source: source, Target: target, Bind: kind == "bind", ReadOnly: readOnly})
		default:
			t.Fatalf("volume %v: unknown form", v)
		}
	}
	return ms
}

// bindSource returns this machine's file that a service sees at target,
// or "" when none is mounted there.
func (s composeService) bindSource(t *testing.T, target string) string {
	t.Helper()
	for _, m := range s.mounts(t) {
		if m.Bind && m.Target == target {
			return m.Source
		}
	}
	return ""
}

// TestCompose validates deploy/compose.yaml with docker-compose config, then
// checks what the quickstart relies on: sluice built from deploy/Dockerfile,
// started once both Postgres servers are healthy, pointed at the compose
// file's own upstream and at both servers (the writable one), a standby
// wired to its primary, its admin port on loopback only, hardened, given
// more than the drain to stop, and with settings and rules that sluice
// accepts. Running it needs images from a registry, which the test
// machines cannot reach.
func TestCompose(t *testing.T) {
	t.Parallel()
	c := composeConfig(t)
	pg, ok1 := c.Services["postgres"]
	up, ok2 := c.Services["upstream"]
	s, ok3 := c.Services["sluice"]
	if !ok1 || !ok2 || !ok3 {
		t.Fatalf("services %v, want postgres, upstream and sluice", c.Services)
	}
	if s.Build == nil || s.Build.Context != root || s.Build.Dockerfile != "deploy/Dockerfile" {
		t.Errorf("sluice's build %+v: want deploy/Dockerfile with the repository as context", s.Build)
	}
	// Its first commit waits for the synchronous standby.
	for _, db := range []string{"postgres", "postgres-standby"} {
		if s.DependsOn[db].Condition != "service_healthy" || c.Services[db].Healthcheck == nil {
			t.Errorf("sluice must wait for a healthy %s: depends_on %v, its healthcheck %v", db, s.DependsOn, c.Services[db].Healthcheck)
		}
	}
	if _, ok := s.DependsOn["upstream"]; !ok || up.Image == "" {
		t.Errorf("sluice must start after the upstream: depends_on %v", s.DependsOn)
	}

	env := s.Environment
	if u, err := url.Parse(env["SLUICE_UPSTREAM"]); err != nil || u.Hostname() != "upstream" {
		t.Errorf("SLUICE_UPSTREAM %q: want the upstream service", env["SLUICE_UPSTREAM"])
	}
	checkComposeDatabaseURL(t, env["SLUICE_DATABASE_URL"], pg)
	for _, k := range []string{"SLUICE_HASH_KEY", "SLUICE_ADMIN_TOKEN", "POSTGRES_PASSWORD", "REPLICATION_PASSWORD"} {
		v := env[k]
		if k == "POSTGRES_PASSWORD" || k == "REPLICATION_PASSWORD" {
			v = pg.Environment[k]
		}
		if !strings.HasPrefix(v, "placeholder-") {
			t.Errorf("%s defaults to %q: a committed value must be an obvious placeholder", k, v)
		}
	}
	checkComposeStandby(t, c)

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
	checkEnv := []string{"PATH=" + os.Getenv("PATH")}
	for k, v := range env {
		checkEnv = append(checkEnv, k+"="+v)
	}
	if out, err := proctest.Run("", checkEnv, sluiceBinary(t), "check-config"); err != nil {
		t.Errorf("sluice check-config with the compose file's environment: %v\n%s", err, out)
	}
}

// checkComposeDatabaseURL: sluice connects to both servers as the
// primary's superuser, to its database, and only to the one that takes
// writes, so that after a promotion it follows the new primary.
func checkComposeDatabaseURL(t *testing.T, dbURL string, pg composeService) {
	t.Helper()
	cfg, err := pgconn.ParseConfig(dbURL)
	if err != nil {
		t.Fatalf("SLUICE_DATABASE_URL: %v", err)
	}
	hosts := []string{net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port)))}
	for _, f := range cfg.Fallbacks {
		hosts = append(hosts, net.JoinHostPort(f.Host, strconv.Itoa(int(f.Port))))
	}
	if want := []string{"postgres:5432", "postgres-standby:5432"}; !slices.Equal(hosts, want) {
		t.Errorf("SLUICE_DATABASE_URL's servers %v, want %v: the primary, then the standby", hosts, want)
	}
	if cfg.User != pg.Environment["POSTGRES_USER"] || cfg.Password != pg.Environment["POSTGRES_PASSWORD"] || cfg.Database != pg.Environment["POSTGRES_DB"] {
		t.Errorf("SLUICE_DATABASE_URL does not match the postgres service's user, password and database")
	}
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatalf("SLUICE_DATABASE_URL: %v", err)
	}
	if attrs := u.Query().Get("target_session_attrs"); attrs != "read-write" {
		t.Errorf("SLUICE_DATABASE_URL's target_session_attrs %q, want read-write: a standby takes no writes", attrs)
	}
}

// checkComposeStandby checks what makes postgres-standby a synchronous
// standby of postgres: each runs its script from deploy/postgres, mounted
// read-only and executable (the image runs an executable init script, and
// sources any other into its own shell); each keeps its data in a volume of
// its own; the standby copies and follows the postgres service as the
// replication role the primary's script makes, under a name the primary
// waits for; and it starts once the primary is healthy. TestSynchronousStandby
// runs the scripts.
func checkComposeStandby(t *testing.T, c composeFile) {
	t.Helper()
	pg, ok1 := c.Services["postgres"]
	sb, ok2 := c.Services["postgres-standby"]
	if !ok1 || !ok2 {
		t.Fatalf("services %v, want postgres and postgres-standby", c.Services)
	}
	if sb.Image != pg.Image {
		t.Errorf("postgres-standby's image %q, postgres's %q: want the same", sb.Image, pg.Image)
	}
	const data = "/var/lib/postgresql/data"
	volumes := map[string]string{}
	for name, svc := range map[string]composeService{"postgres": pg, "postgres-standby": sb} {
		for _, m := range svc.mounts(t) {
			switch {
			case m.Target == data && !m.Bind:
				volumes[name] = m.Source
			case m.Bind && (!m.ReadOnly || !strings.HasPrefix(m.Source, filepath.Join(root, "deploy", "postgres")+"/")):
				t.Errorf("%s mounts %s at %s: want read-only files of deploy/postgres", name, m.Source, m.Target)
			}
		}
	}
	if volumes["postgres"] == "" || volumes["postgres-standby"] == "" || volumes["postgres"] == volumes["postgres-standby"] {
		t.Errorf("data volumes %v: want a named volume at %s for each server, not the same", volumes, data)
	}

	initScripts := primaryInitScripts(t, pg)
	if len(initScripts) == 0 {
		t.Error("postgres has no init script in /docker-entrypoint-initdb.d")
	}
	standbyScript := ""
	if len(sb.Entrypoint) > 0 {
		standbyScript = sb.bindSource(t, sb.Entrypoint[0])
	}
	if standbyScript == "" || sb.User != "postgres" {
		t.Errorf("postgres-standby runs %q as user %q: want a script of deploy/postgres, as postgres", sb.Entrypoint, sb.User)
	}
	for _, f := range append(initScripts, standbyScript) {
		if fi, err := os.Stat(f); err != nil || fi.Mode()&0o111 != 0o111 {
			t.Errorf("%s: want an executable file (%v)", f, err)
		}
	}

	env, penv := sb.Environment, pg.Environment
	if env["PRIMARY_HOST"] != "postgres" || (env["PRIMARY_PORT"] != "" && env["PRIMARY_PORT"] != "5432") {
		t.Errorf("postgres-standby follows %s:%s, want the postgres service", env["PRIMARY_HOST"], env["PRIMARY_PORT"])
	}
	if env["REPLICATION_USER"] == "" || env["REPLICATION_USER"] != penv["REPLICATION_USER"] || env["REPLICATION_PASSWORD"] != penv["REPLICATION_PASSWORD"] {
		t.Error("postgres-standby's REPLICATION_USER and REPLICATION_PASSWORD differ from those postgres's init script gives its role")
	}
	if names := standbyNames(penv["SYNCHRONOUS_STANDBY_NAMES"]); !slices.Contains(names, env["STANDBY_NAME"]) {
		t.Errorf("postgres waits for %v (SYNCHRONOUS_STANDBY_NAMES %q), which is not the standby's STANDBY_NAME %q",
			names, penv["SYNCHRONOUS_STANDBY_NAMES"], env["STANDBY_NAME"])
	}
	if sb.DependsOn["postgres"].Condition != "service_healthy" {
		t.Errorf("postgres-standby must start once postgres is healthy: depends_on %v", sb.DependsOn)
	}
}

// primaryInitScripts returns this machine's files that the postgres
// service's image runs at its first start, in the order it runs them.
func primaryInitScripts(t *testing.T, pg composeService) []string {
	t.Helper()
	var targets []string
	for _, m := range pg.mounts(t) {
		if m.Bind && path.Dir(m.Target) == "/docker-entrypoint-initdb.d" {
			targets = append(targets, m.Target)
		}
	}
	slices.Sort(targets) // the entrypoint's glob
	var files []string
	for _, target := range targets {
		if path.Ext(target) != ".sh" {
			t.Fatalf("%s: the tests run .sh init scripts only", target)
		}
		files = append(files, pg.bindSource(t, target))
	}
	return files
}

// standbyNames returns the standby names a synchronous_standby_names value
// lists: "s1", "s1, s2", "FIRST 1 (s1, s2)" or "ANY 1 (s1, s2)".
func standbyNames(setting string) []string {
	list := setting
	if i := strings.Index(setting, "("); i >= 0 && strings.HasSuffix(setting, ")") {
		list = setting[i+1 : len(setting)-1]
	}
	var names []string
	for _, n := range strings.Split(list, ",") {
		if n = strings.Trim(strings.TrimSpace(n), `"`); n != "" {
			names = append(names, n)
		}
	}
	return names
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
