package proxy

import (
	"errors"
	"io"
	"math/bits"
	"net/http"
	"sync"
)

// Request bodies are buffered before they are forwarded, as nginx's request
// buffering does: a body of up to MaxBodyBytes is read whole first, so that
// a body cut short or with broken chunked framing is answered with 400 and
// never reaches the upstream half-sent, and so that identifiers can be read
// from it. Larger bodies are streamed on routes whose rules need no body,
// and refused with 413 on routes that do.

// minBodyClass is the smallest pooled body buffer; each class is four times
// the one before (1 KiB, 4 KiB, 16 KiB, 64 KiB, ...), so a buffer is never
// more than four times the body it holds.
const minBodyClass = 1 << 10

// bodyPool recycles body buffers by size class. It is safe for concurrent
// use.
type bodyPool struct {
	classes []sync.Pool
}

// newBodyPool returns a pool with classes up to one that holds max+1
// bytes: a body of max bytes plus the byte that shows a longer one.
func newBodyPool(max int64) *bodyPool {
	bp := &bodyPool{classes: make([]sync.Pool, bodyClass(max+1)+1)}
	for i := range bp.classes {
		size := minBodyClass << (2 * i)
		pool := &bp.classes[i]
		pool.New = func() any { return &bodyBuf{buf: make([]byte, 0, size), pool: pool} }
	}
	return bp
}

// bodyClass returns the index of the smallest class that holds n bytes.
func bodyClass(n int64) int {
	if n <= minBodyClass {
		return 0
	}
	return (bits.Len64(uint64(n-1)) - 10 + 1) / 2 // 1 KiB << 2i >= n
}

// get returns an empty buffer that holds at least n bytes (or the largest
// class), referenced once by its owner, the handler, which calls done.
func (bp *bodyPool) get(n int64) *bodyBuf {
	i := min(bodyClass(n), len(bp.classes)-1)
	bb := bp.classes[i].Get().(*bodyBuf)
	bb.mu.Lock()
	bb.refs = 1
	bb.mu.Unlock()
	return bb
}

// grow returns a buffer of the next class holding bb's bytes, and releases
// bb; it returns bb itself when bb is already of the largest class.
func (bp *bodyPool) grow(bb *bodyBuf) *bodyBuf {
	next := bp.get(int64(cap(bb.buf)) + 1)
	if cap(next.buf) <= cap(bb.buf) {
		next.done()
		return bb
	}
	next.buf = append(next.buf, bb.buf...)
	bb.done()
	return next
}

// bodyBuf is one request's buffered body. It goes back to its pool when its
// owner and every reader opened on it are done. The transport may still be
// reading a request body after the handler returned (from an upstream that
// answered early); readers take the buffer's lock and fail once closed, so
// such a late read can never see the buffer after it was recycled.
type bodyBuf struct {
	mu      sync.Mutex
	buf     []byte // the body; cap is the class size
	refs    int    // the owner plus open readers; 0: back in the pool
	gen     uint64 // counts recycles, so a stale GetBody cannot read a reused buffer
	pool    *sync.Pool
	rest    io.ReadCloser // the rest of a streamed (over-limit) body, or nil
	primary *bodyReader   // the reader open gave the request, or nil
}

// errBodyClosed is what a read after Close returns.
var errBodyClosed = errors.New("request body already closed")

// open makes a reader over bb the body of r: a body of known length, or,
// when the rest of it is still to be streamed, one of unknown length.
func (bb *bodyBuf) open(r *http.Request) {
	bb.mu.Lock()
	bb.refs++
	gen := bb.gen
	bb.primary = &bodyReader{b: bb}
	bb.mu.Unlock()
	r.Body = bb.primary
	if bb.rest != nil {
		r.GetBody = nil // the rest cannot be read twice
		return
	}
	r.ContentLength = int64(len(bb.buf))
	r.TransferEncoding = nil
	r.Trailer = nil // forwarded with a Content-Length, so without trailers
	r.GetBody = func() (io.ReadCloser, error) { return bb.reopen(gen) }
}

// reopen implements http.Request.GetBody for a transport that retries a
// request: a fresh reader over the same bytes, while they are still this
// request's.
func (bb *bodyBuf) reopen(gen uint64) (io.ReadCloser, error) {
	bb.mu.Lock()
	defer bb.mu.Unlock()
	if bb.gen != gen || bb.refs == 0 {
		return nil, errBodyClosed
	}
	bb.refs++
	return &bodyReader{b: bb}, nil
}

// done is the owner's release, when the handler returns. It closes the
// primary reader too: httputil.ReverseProxy hands the transport a wrapper
// whose Close does nothing and closes that wrapper when it returns, so the
// primary reader is never closed by anyone else. A transport still writing
// the body then fails its next read, as it would through the wrapper.
// (Readers from GetBody are the transport's own; it closes them.)
func (bb *bodyBuf) done() {
	bb.mu.Lock()
	if r := bb.primary; r != nil && !r.closed {
		r.closed = true
		bb.release()
	}
	bb.primary = nil
	bb.release()
	bb.mu.Unlock()
}

// release drops one reference and recycles the buffer with the last one.
// The caller holds bb.mu.
func (bb *bodyBuf) release() {
	if bb.refs--; bb.refs > 0 {
		return
	}
	if bb.rest != nil {
		bb.rest.Close()
		bb.rest = nil
	}
	bb.buf = bb.buf[:0]
	bb.gen++
	bb.pool.Put(bb)
}

// bodyReader reads a bodyBuf, then the streamed rest if there is one. It
// holds a reference to the buffer until it is closed, and reads after Close
// fail instead of touching a recycled buffer.
type bodyReader struct {
	b      *bodyBuf
	off    int
	closed bool // guarded by b.mu
}

func (r *bodyReader) Read(p []byte) (int, error) {
	bb := r.b
	bb.mu.Lock()
	if r.closed {
		bb.mu.Unlock()
		return 0, errBodyClosed
	}
	if r.off < len(bb.buf) {
		n := copy(p, bb.buf[r.off:])
		r.off += n
		bb.mu.Unlock()
		return n, nil
	}
	rest := bb.rest
	bb.mu.Unlock()
	if rest == nil {
		return 0, io.EOF
	}
	// rest is only closed with the last reference, which this reader holds.
	return rest.Read(p)
}

// Close releases the reader's reference. It may be called more than once.
func (r *bodyReader) Close() error {
	bb := r.b
	bb.mu.Lock()
	defer bb.mu.Unlock()
	if !r.closed {
		r.closed = true
		bb.release()
	}
	return nil
}

// errBodyTooLarge reports a body over MaxBodyBytes on a route that needs it.
var errBodyTooLarge = errors.New("body too large")

// bufferBody reads r's body of up to max bytes whole and makes it r's body
// again, to be forwarded byte for byte with its length. It returns the
// buffer (nil for a request without a body, or for one streamed as is), to
// be released with done when the handler returns.
//
// A body longer than max is refused with errBodyTooLarge when need is set
// (a rule reads it). Otherwise it is streamed: its first max+1 bytes from
// the buffer, the rest from the client as it arrives. A body that cannot be
// read (broken chunked framing, a connection closed or timed out before its
// Content-Length was reached) is an error, answered with 400 by the caller;
// nothing has been sent upstream then.
func (p *Proxy) bufferBody(r *http.Request, need bool) (*bodyBuf, error) {
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
		return nil, nil
	}
	max := p.cfg.MaxBodyBytes
	if r.ContentLength > max {
		if need {
			return nil, errBodyTooLarge
		}
		return nil, nil // stream: the length is known, framing is the server's
	}
	if r.ContentLength > 0 {
		bb := p.bodies.get(r.ContentLength)
		bb.buf = bb.buf[:r.ContentLength]
		if _, err := io.ReadFull(r.Body, bb.buf); err != nil {
			bb.done()
			return nil, err
		}
		bb.open(r)
		return bb, nil
	}
	// Unknown length (chunked, or HTTP/2 without content-length): read up
	// to max+1 bytes, growing through the classes.
	bb := p.bodies.get(minBodyClass)
	for {
		if len(bb.buf) == cap(bb.buf) {
			if bb = p.bodies.grow(bb); len(bb.buf) == cap(bb.buf) {
				break // the largest class: it holds max+1 bytes
			}
		}
		limit := min(int64(cap(bb.buf)), max+1)
		n, err := r.Body.Read(bb.buf[len(bb.buf):limit])
		bb.buf = bb.buf[:len(bb.buf)+n]
		if err == io.EOF {
			break
		}
		if err != nil {
			bb.done()
			return nil, err
		}
		if int64(len(bb.buf)) > max {
			break
		}
	}
	if int64(len(bb.buf)) > max {
		if need {
			bb.done()
			return nil, errBodyTooLarge
		}
		bb.rest = r.Body
	} else {
		r.Body.Close()
	}
	if len(bb.buf) == 0 && bb.rest == nil {
		bb.done()
		r.Body, r.ContentLength, r.TransferEncoding, r.Trailer = http.NoBody, 0, nil, nil
		return nil, nil
	}
	bb.open(r)
	return bb, nil
}
