package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/sluicehq/sluice/policy"
)

// The Redis peer (bench/redis): the baseline's proxy with go-redis/redis_rate
// in front of it, started for each scenario with that scenario's rules.

// redisMetric is the peer's counter of checks by outcome.
const redisMetric = "bench_redis_decisions_total"

// checkRedis runs the peer with -check: it returns Redis's version, or an
// error saying how to leave the target out.
func (b *bench) checkRedis(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(b.dir, "redis"), "-check", "-redis-url="+b.opts.redisURL)
	cmd.Env = childEnv()
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		// The peer's own message is its last line; go-redis logs before it.
		lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
		msg := strings.TrimPrefix(lines[len(lines)-1], "redis: ")
		if msg == "" {
			msg = err.Error()
		}
		return "", fmt.Errorf("target redis (-redis-url %s): %s: start Redis, point -redis-url (or $SLUICE_BENCH_REDIS_URL) at one, or leave the target out with -targets %s",
			redacted(b.opts.redisURL), msg, strings.Join(without(defaultTargets, targetRedis), ","))
	}
	return strings.TrimSpace(string(out)), nil
}

// startRedis starts the Redis peer for scenario s, with s's rules and a
// key prefix of its own, and waits until it is ready (Redis answers).
func (b *bench) startRedis(ctx context.Context, s scenario, _ string, instance int) (*server, error) {
	limits, err := redisLimits(s.rules)
	if err != nil {
		return nil, err
	}
	public, admin, err := freeAddrs()
	if err != nil {
		return nil, err
	}
	args := []string{
		"-listen=" + public,
		"-admin-listen=" + admin,
		"-upstream=" + b.upstream,
		"-redis-url=" + b.opts.redisURL,
		"-prefix=" + b.redisPrefix + "s" + s.id + ":", // fresh counters for every scenario
		"-lifetime=" + b.opts.deadline.String(),
	}
	for _, l := range limits {
		args = append(args, "-limit="+l)
	}
	p, err := b.procs.start(procName("redis-s"+s.id, instance), childEnv(), filepath.Join(b.dir, "redis"), args...)
	if err != nil {
		return nil, err
	}
	sv := &server{proc: p, url: "http://" + public, admin: "http://" + admin, metric: redisMetric}
	if err := waitReady(ctx, p, sv.admin+"/readyz"); err != nil {
		b.procs.stop(p)
		return nil, err
	}
	return sv, nil
}

// redisLimits turns sluice rules into the peer's -limit values
// (NAME=BY,COUNT,WINDOW), in order. The peer applies every rule to every
// request, so only rules that match every request of the harness, with
// the defaults of everything the peer does not model, are accepted. A
// fixed window of COUNT per WINDOW becomes a GCRA of COUNT per WINDOW with
// a burst of COUNT: the same number of requests in a burst, and far from
// the limits except in scenario 4, where either keeps the bad IPs denied
// for the whole run.
func redisLimits(rules string) ([]string, error) {
	p, err := policy.Parse(rules)
	if err != nil {
		return nil, fmt.Errorf("redis peer: %w", err)
	}
	var limits []string
	for _, r := range p.Rules() {
		var problems []string
		if !r.Matches("GET", benchPath) || r.Methods != nil {
			problems = append(problems, "it must match every method on "+benchPath)
		}
		if r.Algorithm != policy.Fixed || r.Shadow || r.Cost != 1 || r.CountAll {
			problems = append(problems, "it must be a plain fixed window (no shadow, cost or count=all)")
		}
		switch r.Identity.Kind {
		case policy.ByIP, policy.ByGlobal:
		case policy.ByTenant:
			if !strings.EqualFold(r.Identity.Field, "X-Tenant-ID") {
				problems = append(problems, "a tenant rule must read X-Tenant-ID")
			}
		default:
			problems = append(problems, "it must count by ip, global or tenant")
		}
		if len(problems) > 0 {
			return nil, fmt.Errorf("redis peer: rule %q: %s", r.Name, strings.Join(problems, "; "))
		}
		limits = append(limits, fmt.Sprintf("%s=%s,%d,%s", r.Name, r.Identity.Kind, r.Limit, r.Window))
	}
	if len(limits) == 0 {
		return nil, errors.New("redis peer: no rules")
	}
	return limits, nil
}

// redacted is u without its password, for messages.
func redacted(u string) string {
	if p, err := url.Parse(u); err == nil {
		return p.Redacted()
	}
	return u
}

// without returns s without v.
func without(s []string, v string) []string {
	var out []string
	for _, x := range s {
		if x != v {
			out = append(out, x)
		}
	}
	return out
}
