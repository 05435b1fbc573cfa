package admin

import (
	"fmt"
	"hash/maphash"
	"runtime"
	"strconv"
	"testing"
)

var testSeed = maphash.MakeSeed()

// add counts a denial in s as topKeys.add would.
func add(s *sketch, rule, key string) {
	s.add(maphash.String(testSeed, rule+"\x00"+key), rule, key)
}

// TestSketchHeavyHitters: with room for every key, the counts are exact;
// with less room, every key denied more than a 1/capacity share is kept,
// and its count is never below the truth nor above it by more than err.
func TestSketchHeavyHitters(t *testing.T) {
	s := newSketch(4)
	for i, n := range []int{5, 3, 2, 1} {
		for range n {
			add(s, "r", "k"+strconv.Itoa(i))
		}
	}
	got := heaviest(s.all(), 4)
	want := []topEntry{{"r", "k0", 5, 0}, {"r", "k1", 3, 0}, {"r", "k2", 2, 0}, {"r", "k3", 1, 0}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("exact counts: got %v, want %v", got, want)
	}

	// A heavy key among a flood of fresh ones (each seen once) in a
	// sketch of 8: the heavy key has a third of the denials.
	s = newSketch(8)
	heavy := 0
	for i := range 3000 {
		if i%3 == 0 {
			add(s, "login", "heavy")
			heavy++
		} else {
			add(s, "login", "fresh"+strconv.Itoa(i))
		}
	}
	top := heaviest(s.all(), 1)[0]
	if top.key != "heavy" || top.count < uint64(heavy) || top.count-top.err > uint64(heavy) {
		t.Fatalf("heavy key: got %+v, want key heavy with count ≥ %d and count-err ≤ %d", top, heavy, heavy)
	}
	if len(s.heap) != 8 || len(s.index) != 8 {
		t.Fatalf("sketch holds %d entries (%d indexed), want 8", len(s.heap), len(s.index))
	}
	for i, it := range s.heap {
		en := s.entries[it.entry]
		if s.index[en.hash] != it.entry || int(en.at) != i {
			t.Fatalf("entry %d %+v: indexed as %d, want at %d", it.entry, en, s.index[en.hash], i)
		}
		if i > 0 && s.heap[(i-1)/2].count > it.count {
			t.Fatalf("heap order broken at %d", i)
		}
	}
}

// TestTopKeysIntervals: the most limited keys add up over the current and
// the past intervals, by rule and key, and an interval is forgotten after
// topIntervals rotations.
func TestTopKeysIntervals(t *testing.T) {
	tk := newTopKeys()
	add := func(rule, key string, n int) {
		for range n {
			tk.add(rule, key)
		}
	}
	add("login", "a", 3)
	add("reset", "a", 1) // another rule: another entry
	tk.rotate()
	add("login", "a", 2)
	add("login", "b", 4)
	got := fmt.Sprint(tk.top(10))
	want := fmt.Sprint([]topEntry{{"login", "a", 5, 0}, {"login", "b", 4, 0}, {"reset", "a", 1, 0}})
	if got != want {
		t.Fatalf("top: got %s, want %s", got, want)
	}
	if got := tk.top(1); len(got) != 1 || got[0].key != "a" {
		t.Fatalf("top(1) = %v", got)
	}
	for range topIntervals {
		tk.rotate()
	}
	// The first interval is gone; the second is the oldest kept.
	want = fmt.Sprint([]topEntry{{"login", "b", 4, 0}, {"login", "a", 2, 0}})
	if got := fmt.Sprint(tk.top(10)); got != want {
		t.Fatalf("after %d rotations: got %s, want %s", topIntervals, got, want)
	}
	tk.rotate()
	if got := tk.top(10); len(got) != 0 {
		t.Fatalf("after %d rotations: %v, want nothing", topIntervals+1, got)
	}
}

// TestTopKeysBoundedMemory: a flood of a million fresh keys, the attack
// of a client rotating identities, leaves the counter's memory where a
// few thousand left it.
func TestTopKeysBoundedMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("a million keys")
	}
	tk := newTopKeys()
	keys := func(from, n int) {
		for i := from; i < from+n; i++ {
			tk.add("login", "fresh-key-"+strconv.Itoa(i))
		}
	}
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	keys(0, 5000)
	tk.rotate()
	keys(5000, 5000)
	before := heap()
	for i := range 10 {
		keys(10_000+i*100_000, 100_000)
		if i%2 == 1 {
			tk.rotate()
		}
	}
	after := heap()
	if after > before+1<<20 {
		t.Fatalf("heap grew from %d to %d bytes over a million fresh keys", before, after)
	}
	n := 0
	for i := range tk.shards {
		n += len(tk.shards[i].s.entries)
	}
	if n > topShards*topPerShard || len(tk.past) > topIntervals {
		t.Fatalf("%d entries now and %d intervals kept", n, len(tk.past))
	}
}

// BenchmarkTopKeysAdd is the cost the Denied hook adds to a denial, from
// as many goroutines as there are CPUs: on 100 keys over their limits,
// which the sketch holds, and on 1,000 (as in the harness's scenario 4)
// or a million, each denied in turn, where every denial replaces an entry
// (the worst case).
func BenchmarkTopKeysAdd(b *testing.B) {
	for _, n := range []int{100, 1000, 1_000_000} {
		b.Run(strconv.Itoa(n)+"keys", func(b *testing.B) {
			tk := newTopKeys()
			keys := make([]string, n)
			for i := range keys {
				keys[i] = fmt.Sprintf("key-%039d", i) // 43 bytes, as hashed keys
			}
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				i := 0
				for pb.Next() {
					tk.add("login", keys[i%len(keys)])
					i += 7
				}
			})
		})
	}
}
