package main

// The processes of bench proxies: the nginx targets and the sluice they ask.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/sluicehq/sluice/internal/proctest"
)

// findNginx returns nginx's path (Debian installs it in /usr/sbin).
func findNginx() (string, error) {
	if p, err := exec.LookPath("nginx"); err == nil {
		return p, nil
	}
	if _, err := os.Stat("/usr/sbin/nginx"); err == nil {
		return "/usr/sbin/nginx", nil
	}
	return "", errors.New("nginx not found: install it with apt-get install -y nginx-light")
}

func nginxVersion(path string) string {
	out, _ := exec.Command(path, "-v").CombinedOutput()
	_, v, _ := strings.Cut(strings.TrimSpace(string(out)), "nginx/")
	return v
}

// buildProxiesBench builds sluice, in its own module, and the harness's
// upstream into dir.
func buildProxiesBench(ctx context.Context, dir string) error {
	harness, product, err := moduleDirs()
	if err != nil {
		return err
	}
	for _, b := range []struct{ dir, pkg string }{{product, "."}, {harness, "./upstream"}} {
		build := proctest.BuildCommand(ctx, b.dir, dir+string(filepath.Separator), "", b.pkg)
		if out, err := build.CombinedOutput(); err != nil {
			return fmt.Errorf("go build in %s: %w\n%s", b.dir, err, out)
		}
	}
	return nil
}

// startDecisionService starts a sluice on store with its check and gRPC
// listeners and no upstream, and returns their addresses once it is ready.
func startDecisionService(ctx context.Context, ps *procs, dir, store string, db *benchDB) (check, rls string, err error) {
	var admin string
	for _, a := range []*string{&check, &rls, &admin} {
		if *a, err = freeAddr(); err != nil {
			return "", "", err
		}
	}
	env := []string{
		"SLUICE_CHECK_LISTEN=" + check,
		"SLUICE_RLS_LISTEN=" + rls,
		"SLUICE_ADMIN_LISTEN=" + admin,
		"SLUICE_RULES=" + proxiesRules,
		"SLUICE_TRUSTED_PROXIES=127.0.0.1/32",
		"SLUICE_LOG_LEVEL=warn",
	}
	if store == targetPostgres {
		env = append(env, "SLUICE_DATABASE_URL="+db.url, "SLUICE_DB_SCHEMA=bench_proxies", "SLUICE_HASH_KEY="+randomHex(32))
	}
	p, err := ps.start("sluice-"+store, childEnv(env...), filepath.Join(dir, "sluice"))
	if err != nil {
		return "", "", err
	}
	return check, rls, waitReady(ctx, p, "http://"+admin+"/readyz")
}

// startBenchNginx starts one nginx with a server block per target: the
// upstream alone, behind limit_req (keyed by the tenant, as sluice's rule,
// with a rate no request reaches), and deploy/nginx/sluice.conf as
// shipped, its addresses replaced, for each sluice. It sets each target's
// URL.
func startBenchNginx(ctx context.Context, ps *procs, nginx, dir, upstream string, checks map[string]string, targets []*nginxTarget) error {
	_, product, err := moduleDirs()
	if err != nil {
		return err
	}
	shipped, err := os.ReadFile(filepath.Join(product, "deploy", "nginx", "sluice.conf"))
	if err != nil {
		return err
	}
	var conf strings.Builder
	fmt.Fprintf(&conf, `worker_processes auto;
pid %[1]s/nginx.pid;
error_log %[1]s/nginx-error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path %[1]s/client_body;
    proxy_temp_path %[1]s/proxy;
    fastcgi_temp_path %[1]s/fastcgi;
    uwsgi_temp_path %[1]s/uwsgi;
    scgi_temp_path %[1]s/scgi;
    upstream bench_app { server %[2]s; keepalive 64; }
    limit_req_zone $http_x_tenant_id zone=bench:32m rate=1000000r/s;
`, dir, upstream)
	for i, t := range targets {
		addr, err := freeAddr()
		if err != nil {
			return err
		}
		t.url = "http://" + addr
		switch {
		case t.sluice != "":
			// The shipped file, in a file of its own, its upstream blocks
			// renamed so that several can share one http block.
			n := fmt.Sprint(i)
			site := strings.NewReplacer(
				"127.0.0.1:9191", checks[t.sluice],
				"127.0.0.1:3000", upstream,
				"listen 8000;", "listen "+addr+";",
				"upstream sluice_check", "upstream sluice_check_"+n,
				"http://sluice_check/", "http://sluice_check_"+n+"/",
				"upstream app", "upstream app_"+n,
				"http://app;", "http://app_"+n+";",
				"map $sluice_status $sluice_error_retry_after", "map $sluice_status $sluice_error_retry_after_"+n,
				"$sluice_error_retry_after always", "$sluice_error_retry_after_"+n+" always",
			).Replace(string(shipped))
			path := filepath.Join(dir, "sluice"+n+".conf")
			if err := os.WriteFile(path, []byte(site), 0o644); err != nil {
				return err
			}
			fmt.Fprintf(&conf, "    include %s;\n", path)
		default:
			limit := ""
			if strings.Contains(t.name, "limit_req") {
				limit = "limit_req zone=bench burst=1000 nodelay;"
			}
			fmt.Fprintf(&conf, `    server {
        listen %s;
        location / {
            %s
            proxy_pass http://bench_app;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }
    }
`, addr, limit)
		}
	}
	conf.WriteString("}\n")
	path := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(path, []byte(conf.String()), 0o644); err != nil {
		return err
	}
	p, err := ps.start("nginx", childEnv(), nginx, "-p", dir, "-e", filepath.Join(dir, "nginx-error.log"), "-c", path, "-g", "daemon off;")
	if err != nil {
		return err
	}
	for _, t := range targets {
		if err := waitReady(ctx, p, t.url+"/"); err != nil {
			return err
		}
	}
	return nil
}
