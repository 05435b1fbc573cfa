package proxy

import (
	"context"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/proxy/respscan"
)

// A request that rules with charge= admitted carries a *charges to its
// response: the reservations to settle, and what reads the cost as the
// response passes. The settlement is committed before the response's
// last bytes are released (its final read, or the end of a body of
// unknown length, which the server marks after the handler returns), so
// a client never holds a complete answer whose cost was not counted.
type charges struct {
	lim    *limiter.Limiter
	ss     []limiter.Settlement
	rules  []*policy.Charge
	header [][]string // per rule, the values of its header(...) charge

	json []scanner // per rule, nil for a header charge or no JSON body
	once sync.Once
}

// scanner is a JSON or an SSE scan of the response body.
type scanner interface {
	io.Writer
	Result() respscan.Result
}

type chargesKey struct{}

// admittedCharges returns the charges of an admitted request, or nil
// when no rule that admitted it reads its cost from the response.
func (p *Proxy) admittedCharges(x *Decision) *charges {
	var c *charges
	now := time.Now()
	for i, chk := range x.Checks {
		if chk.Rule.Charge == nil {
			continue
		}
		if c == nil {
			c = &charges{lim: p.dec.cfg.Limiter}
		}
		res, src := x.Outcome.Results[i], x.Outcome.Sources[i]
		reserved := int64(0)
		// What the store counted for the request: its cost, when the store
		// decided and the check consumed. A fail mode's admission is not
		// in the store, so the whole charge goes there.
		if src == limiter.SourceStore && (res.Allowed || chk.Rule.CountAll) {
			reserved = max(1, chk.Rule.Cost)
		}
		c.ss = append(c.ss, limiter.Settlement{Check: chk, Reserved: reserved, Admitted: limiter.Admitted(res, src, now)})
		c.rules = append(c.rules, chk.Rule.Charge)
	}
	return c
}

func withCharges(ctx context.Context, c *charges) context.Context {
	return context.WithValue(ctx, chargesKey{}, c)
}

func chargesFrom(ctx context.Context) *charges {
	c, _ := ctx.Value(chargesKey{}).(*charges)
	return c
}

// readsBody reports whether a rule of c reads the response body.
func (c *charges) readsBody() bool {
	for _, r := range c.rules {
		if r.Header == "" {
			return true
		}
	}
	return false
}

// watch sets c up to read res as it passes: its header now, its body
// through the scanners its media type calls for.
func (c *charges) watch(res *http.Response) {
	c.header = make([][]string, len(c.rules))
	for i, r := range c.rules {
		if r.Header != "" {
			c.header[i] = res.Header[r.Header]
		}
	}
	kind := ""
	if c.readsBody() && identityEncoded(res.Header) {
		kind = bodyKind(res.Header.Get("Content-Type"))
	}
	c.json = make([]scanner, len(c.rules))
	watched := false
	for i, r := range c.rules {
		switch {
		case r.Header != "":
		case kind == "json":
			c.json[i] = respscan.NewJSON(r.Paths)
			watched = true
		case kind == "sse":
			c.json[i] = respscan.NewSSE(r.Paths)
			watched = true
		}
	}
	body := &chargedBody{ReadCloser: res.Body, c: c, left: res.ContentLength, watched: watched}
	if res.Body == nil || res.Body == http.NoBody {
		body.ReadCloser = http.NoBody
	}
	res.Body = body
}

// identityEncoded reports whether the body is sent as it is (no
// Content-Encoding, or identity): sluice asks for that, but an upstream
// may compress anyway, and then its counts are not read.
func identityEncoded(h http.Header) bool {
	for _, v := range h["Content-Encoding"] {
		if !strings.EqualFold(strings.TrimSpace(v), "identity") {
			return false
		}
	}
	return true
}

// bodyKind is "json" for application/json and any +json type, "sse" for
// text/event-stream, and "" for what charges are not read from.
func bodyKind(contentType string) string {
	mt, _, err := mime.ParseMediaType(contentType)
	switch {
	case err != nil:
		return ""
	case mt == "application/json" || strings.HasSuffix(mt, "+json"):
		return "json"
	case mt == "text/event-stream":
		return "sse"
	}
	return ""
}

// settle works out each rule's charge from what the response said and
// commits it, once.
func (c *charges) settle(ctx context.Context) {
	c.once.Do(func() {
		for i, r := range c.rules {
			s := &c.ss[i]
			reservation := max(1, s.Check.Rule.Cost)
			charge, read := reservation, limiter.ChargeMissing
			if r.Header != "" {
				charge, read = headerCharge(c.header[i], reservation)
			} else if c.json[i] != nil {
				sum, ok, invalid := c.json[i].Result().Sum()
				switch {
				case invalid:
					read = limiter.ChargeInvalid
				case ok:
					charge, read = sum, limiter.ChargeCharged
				}
			}
			s.Charge, s.Read = charge, read
		}
		c.lim.Settle(ctx, c.ss)
	})
}

// headerCharge reads a header(...) charge: one value of digits only.
func headerCharge(vs []string, reservation int64) (int64, string) {
	if len(vs) == 0 {
		return reservation, limiter.ChargeMissing
	}
	if len(vs) > 1 || vs[0] == "" || strings.Trim(vs[0], "0123456789") != "" {
		return reservation, limiter.ChargeInvalid
	}
	n, err := strconv.ParseInt(vs[0], 10, 64)
	if err != nil || n > policy.MaxCount {
		return reservation, limiter.ChargeInvalid
	}
	return n, limiter.ChargeCharged
}

// chargedBody passes the upstream's body through unchanged, feeding the
// scanners, and settles the charges before the last bytes leave: with
// the read that completes a body of known length, at the end of one of
// unknown length (the server ends it once the handler returns), when the
// upstream cuts it short, or when the client goes away (Close).
type chargedBody struct {
	io.ReadCloser
	c       *charges
	left    int64 // bytes of a known length still to come; -1 unknown
	watched bool  // some scanner reads the body
}

func (b *chargedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if n > 0 && b.watched {
		for _, s := range b.c.json {
			if s != nil {
				s.Write(p[:n])
			}
		}
	}
	if b.left >= 0 {
		b.left -= int64(n)
	}
	if err != nil || b.left == 0 {
		b.scanEnd()
		b.c.settle(context.Background())
	}
	return n, err
}

// scanEnd tells the JSON scanners the body ended.
func (b *chargedBody) scanEnd() {
	for _, s := range b.c.json {
		if j, ok := s.(*respscan.JSON); ok {
			j.End()
		}
	}
}

func (b *chargedBody) Close() error {
	b.scanEnd()
	b.c.settle(context.Background())
	return b.ReadCloser.Close()
}
