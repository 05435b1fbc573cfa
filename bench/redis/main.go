// Command redis is the load harness's Redis-backed peer (see
// bench/README.md): the limiter a Go user would otherwise pick. It is the
// baseline's reverse proxy — the same transport (proxy.NewTransport), the
// same server timeouts (proxy.NewServer), the same flushing, the same
// X-Forwarded-* headers — with go-redis/redis_rate (GCRA in one Lua
// script in Redis) in front of it: one Allow call per rule (-limit), each
// under the deadline sluice gives its store by default, and 429 without
// contacting the upstream when a rule denies. See gate.go for how it
// derives its keys.
//
// Every key it writes starts with redis_rate's "rate:" and -prefix; it
// deletes them when it is stopped (SIGTERM), so that runs never see one
// another's counts. With -check it only reports whether Redis answers,
// and its version.
//
// Of sluice it imports only hashing, proxy and proxy/identity.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/proxy"
	"github.com/sluicehq/sluice/proxy/identity"
)

// options are the command-line flags.
type options struct {
	listen, admin, upstream string
	redisURL, prefix        string
	rules                   []rule
	timeout, lifetime       time.Duration
	check                   bool
}

func main() {
	var o options
	flag.StringVar(&o.listen, "listen", "127.0.0.1:8083", "address to listen on (loopback)")
	flag.StringVar(&o.admin, "admin-listen", "127.0.0.1:9093", "address of /readyz and /metrics")
	flag.StringVar(&o.upstream, "upstream", "http://127.0.0.1:8081", "upstream base URL")
	flag.StringVar(&o.redisURL, "redis-url", "redis://127.0.0.1:6379/0", "Redis to count in")
	flag.StringVar(&o.prefix, "prefix", "sluice-bench:", "prefix of every key, after redis_rate's \"rate:\"; letters, digits, '-', '_' and ':'")
	flag.Func("limit", "a rule NAME=BY,COUNT,WINDOW (BY: ip, global or tenant; WINDOW a Go duration), repeatable, checked in order", func(s string) error {
		r, err := parseRule(s)
		o.rules = append(o.rules, r)
		return err
	})
	flag.DurationVar(&o.timeout, "timeout", 50*time.Millisecond, "deadline of one Allow call (sluice's default SLUICE_DB_TIMEOUT); past it the rule fails open")
	flag.DurationVar(&o.lifetime, "lifetime", 30*time.Minute, "exit after this long even if nobody stops us")
	flag.BoolVar(&o.check, "check", false, "only check that Redis answers, print its version and exit")
	flag.Parse()
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "redis:", err)
		os.Exit(1)
	}
}

func run(o options) error {
	ropts, err := redis.ParseURL(o.redisURL)
	if err != nil {
		return fmt.Errorf("-redis-url: %w", err)
	}
	// Without it go-redis ignores the context's deadline on the socket,
	// and -timeout would bound nothing.
	ropts.ContextTimeoutEnabled = true
	rdb := redis.NewClient(ropts)
	defer rdb.Close()
	if o.check {
		v, err := redisVersion(context.Background(), rdb)
		if err != nil {
			return err
		}
		fmt.Println(v)
		return nil
	}
	if o.prefix == "" || strings.Trim(o.prefix, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_:") != "" {
		return fmt.Errorf("-prefix %q: letters, digits, '-', '_' and ':' only, not empty", o.prefix)
	}
	if len(o.rules) == 0 {
		return errors.New("no -limit: nothing to limit")
	}
	target, err := proxy.ParseUpstream(o.upstream)
	if err != nil {
		return fmt.Errorf("-upstream: %w", err)
	}
	trusted, err := identity.ParseTrustedProxies("127.0.0.1/32") // as the harness sets up sluice
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, o.lifetime)
	defer cancel()
	if _, err := redisVersion(ctx, rdb); err != nil {
		return err
	}

	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.SetXForwarded()
		},
		Transport:     proxy.NewTransport(proxy.DefaultTimeouts().Upstream),
		FlushInterval: -1,
	}
	g := &gate{
		rules:   o.rules,
		prefix:  o.prefix,
		trusted: trusted,
		lim:     redis_rate.NewLimiter(rdb),
		timeout: o.timeout,
		next:    rp,
	}
	srv := proxy.NewServer(g, proxy.DefaultTimeouts())
	mux := http.NewServeMux()
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if err := rdb.Ping(r.Context()).Err(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
		}
	})
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		g.writeMetrics(w)
	})
	admin := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}

	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return err
	}
	adminLn, err := net.Listen("tcp", o.admin)
	if err != nil {
		ln.Close()
		return err
	}
	errc := make(chan error, 2)
	go func() { errc <- srv.Serve(ln) }()
	go func() { errc <- admin.Serve(adminLn) }()
	select {
	case err = <-errc:
	case <-ctx.Done():
	}
	shutdownCtx, cancelShutdown := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancelShutdown()
	err = errors.Join(err, srv.Shutdown(shutdownCtx), admin.Shutdown(shutdownCtx))
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	n, delErr := deletePrefix(shutdownCtx, rdb, "rate:"+o.prefix)
	if delErr == nil {
		fmt.Fprintf(os.Stderr, "redis: deleted %d keys under rate:%s\n", n, o.prefix)
	}
	return errors.Join(err, delErr)
}

// redisVersion pings Redis and returns its version.
func redisVersion(ctx context.Context, rdb *redis.Client) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	info, err := rdb.Info(ctx, "server").Result()
	if err != nil {
		return "", fmt.Errorf("no answer from Redis at %s: %w", rdb.Options().Addr, err)
	}
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
			return "Redis " + v, nil
		}
	}
	return "Redis", nil
}

// deletePrefix deletes every key starting with prefix (which holds no
// glob character) and returns how many it deleted.
func deletePrefix(ctx context.Context, rdb *redis.Client, prefix string) (int, error) {
	var n int
	var batch []string
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		err := rdb.Unlink(ctx, batch...).Err()
		n += len(batch)
		batch = batch[:0]
		return err
	}
	it := rdb.Scan(ctx, 0, prefix+"*", 1000).Iterator()
	for it.Next(ctx) {
		if batch = append(batch, it.Val()); len(batch) == 500 {
			if err := flush(); err != nil {
				return n, fmt.Errorf("delete keys under %s: %w", prefix, err)
			}
		}
	}
	if err := errors.Join(it.Err(), flush()); err != nil {
		return n, fmt.Errorf("delete keys under %s: %w", prefix, err)
	}
	return n, nil
}
