// Package deploy holds sluice's deployment artifacts, not code: the
// container image (Dockerfile), a compose file with the scripts of its
// Postgres primary and synchronous standby, Kubernetes manifests (and an
// example Postgres cluster), a systemd unit, the database roles,
// Prometheus alerts, a Grafana dashboard, and the configurations that put
// sluice behind other proxies as their decision service (nginx, Caddy,
// Traefik, Envoy). Its tests build, render, verify or run each of them
// with the real tool (podman, kustomize, systemd-analyze, psql and
// PostgreSQL's servers, promtool, docker-compose, shellcheck, nginx,
// caddy; Envoy's configuration with Envoy's own types) and a real sluice;
// Traefik, which Debian does not package, only has its file checked.
//
// A test whose tool is missing is skipped with a message naming the
// package to install, and fails instead when the CI environment variable
// is set; .ci/run installs them all.
//
// It has no code but tests, and nothing may import it.
package deploy
