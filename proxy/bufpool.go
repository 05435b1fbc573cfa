package proxy

import "sync"

// copyBufferSize is the size of the buffers a response body is copied
// through, the size httputil.ReverseProxy allocates when it has no pool.
const copyBufferSize = 32 << 10

// bufferPool recycles the ReverseProxy's copy buffers. Without one, every
// proxied response allocates a fresh 32 KiB buffer, a large-object
// allocation that was the biggest single source of garbage per request.
// It pools array pointers, which go in and out of a sync.Pool without an
// allocation (a pooled slice would need a new header box on every Put).
type bufferPool struct{ p sync.Pool }

func newBufferPool() *bufferPool {
	return &bufferPool{p: sync.Pool{New: func() any { return new([copyBufferSize]byte) }}}
}

// Get implements httputil.BufferPool.
func (bp *bufferPool) Get() []byte { return bp.p.Get().(*[copyBufferSize]byte)[:] }

// Put implements httputil.BufferPool. Only buffers of the pool's own size
// come back, so a pooled buffer never grows or shrinks.
func (bp *bufferPool) Put(b []byte) {
	if cap(b) != copyBufferSize {
		return
	}
	bp.p.Put((*[copyBufferSize]byte)(b[:copyBufferSize]))
}
