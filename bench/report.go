package main

import (
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
)

// writeTable prints the results as one Markdown table. Requests/s and
// latencies are medians over the rounds. Ratios are medians of per-round
// ratios: each round's target against the baseline run of the same round,
// measured minutes apart at most, so that a noisy neighbour on a shared
// machine weighs on both sides of a ratio.
func writeTable(w io.Writer, results []result) {
	fmt.Fprintln(w, "| scenario | target | req/s | p50 | p99 | req/s ÷ baseline | p99 ÷ baseline | CPU µs/request | pg xact/decision | cold: pg xact/decision | allowed | denied | failed checks |")
	fmt.Fprintln(w, "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
	var socketErrors, failing []string
	for _, r := range results {
		i := slices.IndexFunc(results, func(b result) bool {
			return b.scenario.id == r.scenario.id && b.target == targetBaseline
		})
		rpsRatio, p99Ratio := "–", "–"
		if i >= 0 && r.target != targetBaseline {
			base := results[i].rounds
			rpsRatio = ratio(r.rounds, base, wrkResult.rps)
			p99Ratio = ratio(r.rounds, base, func(x wrkResult) float64 { return x.P99US })
		}
		xacts := "–"
		if r.xacts >= 0 && r.requests > 0 {
			xacts = fmt.Sprintf("%.3f", float64(r.xacts)/float64(r.requests))
		}
		cold := "–"
		if r.coldXacts >= 0 && r.coldRequests > 0 {
			cold = fmt.Sprintf("%.3f", float64(r.coldXacts)/float64(r.coldRequests))
		}
		failed := "–"
		if r.failed >= 0 {
			failed = strconv.FormatInt(r.failed, 10)
		}
		var allowed, denied, sockErr int64
		for _, x := range r.rounds {
			allowed += x.Requests - x.Non2xx
			denied += x.Non2xx
			sockErr += x.SocketErrors
		}
		cpu := "–"
		if r.cpu >= 0 && allowed+denied > 0 {
			cpu = fmt.Sprintf("%.1f", float64(ticks(r.cpu).Microseconds())/float64(allowed+denied))
		}
		fmt.Fprintf(w, "| %s. %s | %s | %.0f | %s | %s | %s | %s | %s | %s | %s | %d | %d | %s |\n",
			r.scenario.id, r.scenario.title, targetName(r.target),
			median(r.rounds, wrkResult.rps),
			millis(median(r.rounds, func(x wrkResult) float64 { return x.P50US })),
			millis(median(r.rounds, func(x wrkResult) float64 { return x.P99US })),
			rpsRatio, p99Ratio, cpu, xacts, cold, allowed, denied, failed)
		if r.failed > (allowed+denied)/100 {
			failing = append(failing, fmt.Sprintf("scenario %s %s", r.scenario.id, targetName(r.target)))
		}
		if sockErr > 0 {
			socketErrors = append(socketErrors, fmt.Sprintf("scenario %s %s: %d", r.scenario.id, targetName(r.target), sockErr))
		}
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "req/s, p50, p99: medians over the rounds; ratios: medians of each round's ratio to the baseline's run in the same round."+
		" CPU µs/request: the CPU time (user and system) of the target's own process during the rounds, per request: what it costs, which a noisy neighbour moves far less than it moves req/s (not measured for the baseline)."+
		" pg xact/decision: transactions in pg_stat_database of sluice's own database during the rounds, per request;"+
		" cold: the same during the warm-up, the first load on a fresh sluice and database (leases not granted yet)."+
		" allowed/denied: wrk's 2xx/3xx and other responses, all rounds."+
		" failed checks: sluice_decisions_total outcomes failed_open, failed_closed and local (the store did not decide within SLUICE_DB_TIMEOUT); for redis_rate, Allow calls that failed or missed the same 50 ms deadline and let the request through.")
	for _, r := range results {
		if r.spans < 0 {
			continue
		}
		var requests int64
		for _, x := range r.rounds {
			requests += x.Requests
		}
		fmt.Fprintf(w, "\nScenario %s, %s: the OTLP sink received %d spans during the rounds, %.2f per request (every request is sampled: a server span, the decision's, the store call's unless the fast path answered, and the upstream request's unless it was denied).\n",
			r.scenario.id, targetName(r.target), r.spans, float64(r.spans)/float64(max(requests, 1)))
	}
	if len(failing) > 0 {
		fmt.Fprintf(w, "\nWarning: more than 1%% of the checks failed in %s: their store did not decide in time, so their req/s, latencies and xact/decision describe the fail mode, not the store.\n", strings.Join(failing, "; "))
	}
	if len(socketErrors) > 0 {
		fmt.Fprintf(w, "\nSocket errors (connect, read, write, timeout): %s\n", strings.Join(socketErrors, "; "))
	}
}

func targetName(t string) string {
	switch t {
	case targetBaseline:
		return "baseline"
	case targetRedis:
		return "redis_rate"
	case targetTraced:
		return "sluice memory, traced"
	case targetBefore:
		return "sluice memory, before"
	}
	return "sluice " + t
}

// median returns the median of f over rs (the mean of the middle two for
// an even count).
func median(rs []wrkResult, f func(wrkResult) float64) float64 {
	v := make([]float64, len(rs))
	for i, r := range rs {
		v[i] = f(r)
	}
	return medianOf(v)
}

// ratio formats the median over rounds of f(rs[i]) / f(base[i]).
func ratio(rs, base []wrkResult, f func(wrkResult) float64) string {
	var v []float64
	for i := range min(len(rs), len(base)) {
		if b := f(base[i]); b > 0 {
			v = append(v, f(rs[i])/b)
		}
	}
	if len(v) == 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f", medianOf(v))
}

func medianOf(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	slices.Sort(v)
	m := len(v) / 2
	if len(v)%2 == 0 {
		return (v[m-1] + v[m]) / 2
	}
	return v[m]
}

func millis(us float64) string {
	return fmt.Sprintf("%.2f ms", us/1000)
}
