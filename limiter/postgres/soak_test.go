package postgres_test

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/pgtest"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/postgres"
)

// TestSoak: a minute of decisions with a one-second window over tens of
// thousands of keys (up to 1,000 new keys every second, each used twice),
// on the database's clock, with Run's cleanup every five seconds. The counters table never
// holds more than the keys of the last cleanup period and a few windows,
// and the process's heap after a collection is flat once warm. The hour
// long version is `go -C bench run . soak -duration 1h`.
//
// It reads the heap of the whole test process, so it is never parallel:
// the package's parallel tests start only once it has ended. .ci/test
// runs it in a process of its own beside the others.
func TestSoak(t *testing.T) {
	if testing.Short() {
		t.Skip("a minute long")
	}
	const (
		duration      = time.Minute
		keysPerSecond = 1000
		cleanupEvery  = 5 * time.Second
		warmUp        = 15 * time.Second
	)
	db := pgtest.New(t)
	s := open(t, db, pgtest.NewPool(t, db.URL, 4), nil, func(o *postgres.Options) {
		o.CleanupInterval = cleanupEvery
		o.CleanupPause = limiter.Off
	})
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { defer close(ran); s.Run(ctx) }()
	defer func() { cancel(); <-ran }()

	r := fixed("soak", 10, time.Second)
	began := time.Now()
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		failed int
	)
	for w := range 8 {
		wg.Go(func() {
			res := make([]limiter.Result, 1)
			for i := w; time.Since(began) < duration; i += 8 {
				sec := int(time.Since(began) / time.Second)
				key := fmt.Sprintf("%d-%d", sec, (i/2)%keysPerSecond)
				if _, err := s.Decide(context.Background(), []limiter.Check{chk(r, key)}, res); err != nil {
					mu.Lock()
					failed++
					mu.Unlock()
				}
				// About 2,000 decisions a second in all.
				time.Sleep(4 * time.Millisecond)
			}
		})
	}

	maxRows := (int(cleanupEvery/time.Second) + 3) * keysPerSecond
	var (
		warmHeap, lastHeap uint64
		peakRows           int
	)
	for tick := time.NewTicker(time.Second); time.Since(began) < duration; <-tick.C {
		rows := rowCount(t, db)
		peakRows = max(peakRows, rows)
		if rows > maxRows {
			t.Errorf("%v in: %d counters, want at most %d (the keys of one cleanup period and three windows)",
				time.Since(began).Round(time.Second), rows, maxRows)
		}
		var m runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&m)
		lastHeap = m.HeapInuse
		if warmHeap == 0 && time.Since(began) >= warmUp {
			warmHeap = m.HeapInuse
		}
	}
	wg.Wait()
	if failed > 0 {
		t.Errorf("%d decisions failed", failed)
	}
	t.Logf("peak %d counters (bound %d); heap in use %.1f MB after warm-up, %.1f MB at the end; resident %.1f MB",
		peakRows, maxRows, float64(warmHeap)/1e6, float64(lastHeap)/1e6, float64(selfRSS(t))/1e6)
	if lastHeap > warmHeap+4<<20 {
		t.Errorf("heap in use grew from %.1f MB to %.1f MB after warm-up", float64(warmHeap)/1e6, float64(lastHeap)/1e6)
	}
}

// selfRSS returns this process's resident memory in bytes.
func selfRSS(t *testing.T) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	return 0
}
