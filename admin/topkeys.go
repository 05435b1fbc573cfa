package admin

import (
	"cmp"
	"hash/maphash"
	"slices"
	"sync"
)

// The most limited keys are counted with the space-saving algorithm
// (Metwally, Agrawal and El Abbadi, 2005): a sketch holds at most a fixed
// number of keys; a key not in a full sketch takes the place of the one
// with the smallest count and inherits that count as its possible error.
// Any key denied more often than a 1/capacity share of the denials is
// guaranteed to be in the sketch, and a flood of fresh keys (an attacker
// rotating identities) only ever replaces the smallest entries: memory
// never grows past the capacity, whatever the traffic.

// topEntry is one key of a sketch: how often it was denied, at most err
// of which may belong to the keys it replaced.
type topEntry struct {
	rule, key  string
	count, err uint64
}

// sketch is a space-saving summary over a fixed array of entries: a
// min-heap of counts, each naming its entry, and an index from the hash of
// a rule and key to its entry. A heap move updates the moved entries'
// places, never the index, which changes only when a key takes another's
// place. Two keys whose 64-bit hashes collide (a chance of 2⁻⁶⁴ per pair,
// with a seed an attacker cannot know) would share a count. It is not
// safe for simultaneous use.
type sketch struct {
	heap    []heapItem       // the least count first
	entries []slot           // what each heap item counts
	index   map[uint64]int32 // entry of each hash of rule and key
}

type heapItem struct {
	count uint64
	entry int32
}

type slot struct {
	rule, key string
	hash      uint64 // its key in index
	err       uint64
	at        int32 // place in heap
}

func newSketch(capacity int) *sketch {
	return &sketch{
		heap:    make([]heapItem, 0, capacity),
		entries: make([]slot, 0, capacity),
		index:   make(map[uint64]int32, capacity),
	}
}

// add counts one denial of key under rule, whose hash is h.
func (s *sketch) add(h uint64, rule, key string) {
	if e, ok := s.index[h]; ok {
		at := int(s.entries[e].at)
		s.heap[at].count++
		s.down(at)
		return
	}
	if len(s.entries) < cap(s.entries) {
		e := int32(len(s.entries))
		s.entries = append(s.entries, slot{rule: rule, key: key, hash: h, at: int32(len(s.heap))})
		s.heap = append(s.heap, heapItem{count: 1, entry: e})
		s.index[h] = e
		s.up(len(s.heap) - 1)
		return
	}
	// Full: the key takes the place of the least counted one.
	least := &s.heap[0]
	en := &s.entries[least.entry]
	delete(s.index, en.hash)
	*en = slot{rule: rule, key: key, hash: h, err: least.count, at: 0}
	least.count++
	s.index[h] = least.entry
	s.down(0)
}

// all returns the sketch's entries.
func (s *sketch) all() []topEntry {
	out := make([]topEntry, len(s.heap))
	for i, it := range s.heap {
		en := &s.entries[it.entry]
		out[i] = topEntry{rule: en.rule, key: en.key, count: it.count, err: en.err}
	}
	return out
}

// reset empties s, keeping its storage.
func (s *sketch) reset() {
	s.heap = s.heap[:0]
	s.entries = s.entries[:0]
	clear(s.index)
}

func (s *sketch) swap(i, j int) {
	s.heap[i], s.heap[j] = s.heap[j], s.heap[i]
	s.entries[s.heap[i].entry].at = int32(i)
	s.entries[s.heap[j].entry].at = int32(j)
}

func (s *sketch) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if s.heap[i].count >= s.heap[p].count {
			return
		}
		s.swap(i, p)
		i = p
	}
}

func (s *sketch) down(i int) {
	n := len(s.heap)
	for {
		l := 2*i + 1
		if l >= n {
			return
		}
		m := l
		if r := l + 1; r < n && s.heap[r].count < s.heap[l].count {
			m = r
		}
		if s.heap[m].count >= s.heap[i].count {
			return
		}
		s.swap(i, m)
		i = m
	}
}

// Sizes of the top-keys counter.
const (
	topShards = 8
	// topPerShard is each shard's sketch capacity: 512 keys in all per
	// interval.
	topPerShard = 64
	// topKept is how many entries of an interval are kept once it is over.
	topKept = 64
	// topIntervals is how many past intervals are kept: the last
	// minutes the console shows.
	topIntervals = 5
)

// topKeys counts denials by rule and hashed key in the current interval,
// and keeps the heaviest entries of the last topIntervals intervals. Keys
// are spread over shards, each with its own lock, so that simultaneous
// denials rarely wait for each other. Its memory is fixed: at most
// topShards×topPerShard entries now and topIntervals×topKept before.
type topKeys struct {
	seed   maphash.Seed
	shards [topShards]struct {
		mu sync.Mutex
		s  *sketch
		_  [48]byte // a cache line of its own (with mu and s)
	}

	mu   sync.Mutex   // guards past and spare
	past [][]topEntry // the last intervals, newest last
	// spare is an emptied sketch that rotate swaps in, so the writers'
	// lock is held only for a swap.
	spare *sketch
}

func newTopKeys() *topKeys {
	t := &topKeys{seed: maphash.MakeSeed(), spare: newSketch(topPerShard)}
	for i := range t.shards {
		t.shards[i].s = newSketch(topPerShard)
	}
	return t
}

// add counts one denial of key under rule. Safe for simultaneous use.
func (t *topKeys) add(rule, key string) {
	h := maphash.String(t.seed, key) ^ maphash.String(t.seed, rule)*0x9e3779b97f4a7c15
	sh := &t.shards[h%topShards]
	sh.mu.Lock()
	sh.s.add(h, rule, key)
	sh.mu.Unlock()
}

// rotate ends the current interval: its heaviest entries join the past
// ones, and the oldest past interval is forgotten.
func (t *topKeys) rotate() {
	t.mu.Lock()
	defer t.mu.Unlock()
	var ended []topEntry
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		full := sh.s
		sh.s = t.spare
		sh.mu.Unlock()
		ended = append(ended, full.all()...)
		full.reset()
		t.spare = full
	}
	ended = heaviest(ended, topKept)
	t.past = append(t.past, ended)
	if len(t.past) > topIntervals {
		t.past = slices.Delete(t.past, 0, len(t.past)-topIntervals)
	}
}

// top returns the n most denied keys of the past intervals and the
// current one, added up by rule and key, the most denied first.
func (t *topKeys) top(n int) []topEntry {
	var all []topEntry
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		all = append(all, sh.s.all()...)
		sh.mu.Unlock()
	}
	t.mu.Lock()
	for _, p := range t.past {
		all = append(all, p...)
	}
	t.mu.Unlock()
	type topID struct{ rule, key string }
	sum := make(map[topID]*topEntry, len(all))
	var merged []*topEntry
	for _, e := range all {
		id := topID{e.rule, e.key}
		if m, ok := sum[id]; ok {
			m.count += e.count
			m.err += e.err
			continue
		}
		m := e
		sum[id] = &m
		merged = append(merged, &m)
	}
	out := make([]topEntry, len(merged))
	for i, m := range merged {
		out[i] = *m
	}
	return heaviest(out, n)
}

// heaviest sorts es by count, the largest first (then by rule and key,
// so the order is stable), and keeps at most n.
func heaviest(es []topEntry, n int) []topEntry {
	slices.SortFunc(es, func(a, b topEntry) int {
		return cmp.Or(cmp.Compare(b.count, a.count), cmp.Compare(a.rule, b.rule), cmp.Compare(a.key, b.key))
	})
	return es[:min(n, len(es))]
}
