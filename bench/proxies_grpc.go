package main

// The gRPC side of bench proxies: Envoy's calls to sluice's rate limit
// service, from many callers or one.

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"sync"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// grpcResult is one gRPC measurement.
type grpcResult struct {
	decisions, errors int64
	took              time.Duration
	p50, p99          time.Duration
}

func (r grpcResult) rate() float64 { return float64(r.decisions) / r.took.Seconds() }

// measureRLS drives the gRPC listener at addr for o.duration with
// o.callers closed-loop callers, each sending one descriptor call at a
// time (a tenant in rotation), over o.conns shared HTTP/2 connections.
func measureRLS(ctx context.Context, addr string, o proxiesOptions) (grpcResult, error) {
	var clients []rlsv3.RateLimitServiceClient
	for range o.conns {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return grpcResult{}, err
		}
		defer conn.Close()
		clients = append(clients, rlsv3.NewRateLimitServiceClient(conn))
	}
	// One unmeasured call per connection: the connection set-up is not
	// the service's latency.
	for _, c := range clients {
		if _, err := c.ShouldRateLimit(ctx, rlsRequest(0)); err != nil {
			return grpcResult{}, fmt.Errorf("rate limit service at %s: %w", addr, err)
		}
	}
	var (
		mu        sync.Mutex
		latencies []time.Duration
		errs      int64
		wg        sync.WaitGroup
	)
	began := time.Now()
	end := began.Add(o.duration)
	for i := range o.callers {
		wg.Go(func() {
			c := clients[i%len(clients)]
			var own []time.Duration
			var failed int64
			for k := i; time.Now().Before(end) && ctx.Err() == nil; k += o.callers {
				callCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
				t0 := time.Now()
				res, err := c.ShouldRateLimit(callCtx, rlsRequest(k%o.keys))
				own = append(own, time.Since(t0))
				cancel()
				if err != nil || res.GetOverallCode() != rlsv3.RateLimitResponse_OK {
					failed++
				}
			}
			mu.Lock()
			latencies = append(latencies, own...)
			errs += failed
			mu.Unlock()
		})
	}
	wg.Wait()
	took := time.Since(began)
	if err := ctx.Err(); err != nil {
		return grpcResult{}, err
	}
	slices.Sort(latencies)
	return grpcResult{
		decisions: int64(len(latencies)), errors: errs, took: took,
		p50: percentile(latencies, 50), p99: percentile(latencies, 99),
	}, nil
}

// rlsRequest is Envoy's call for tenant k.
func rlsRequest(k int) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: "bench", Descriptors: []*ratelimitv3.RateLimitDescriptor{{
		Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "tenant", Value: "tenant-" + strconv.Itoa(k)}},
	}}}
}

// grpcRow is one line of the gRPC table: a store and a number of callers,
// with its rounds.
type grpcRow struct {
	store   string
	callers int
	rounds  []grpcResult
}

// writeGRPCTable prints the gRPC measurements: medians over the rounds
// and the spread of decisions a second.
func writeGRPCTable(w io.Writer, rows []grpcRow) {
	fmt.Fprintln(w, "| gRPC rate limit service | callers | decisions/s | lowest–highest round | p50 | p99 | failed or not OK |")
	fmt.Fprintln(w, "|---|--:|--:|--:|--:|--:|--:|")
	for _, row := range rows {
		rates := make([]float64, len(row.rounds))
		var p50s, p99s []time.Duration
		var errs int64
		for i, r := range row.rounds {
			rates[i] = r.rate()
			p50s, p99s = append(p50s, r.p50), append(p99s, r.p99)
			errs += r.errors
		}
		slices.Sort(rates)
		slices.Sort(p50s)
		slices.Sort(p99s)
		fmt.Fprintf(w, "| sluice (%s) | %d | %.0f | %.0f–%.0f | %s | %s | %d |\n", row.store, row.callers,
			rates[len(rates)/2], rates[0], rates[len(rates)-1],
			fmtDuration(p50s[len(p50s)/2]), fmtDuration(p99s[len(p99s)/2]), errs)
	}
}

// fmtDuration shows a latency in milliseconds with two decimals.
func fmtDuration(d time.Duration) string {
	return fmt.Sprintf("%.2f ms", float64(d.Microseconds())/1000)
}
