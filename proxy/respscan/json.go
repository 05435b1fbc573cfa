// Package respscan reads what a response says a request cost while the
// response passes to the client: integers at JSON paths of a JSON body or
// of each event of a server-sent event stream, fed in whatever pieces the
// upstream sends, in memory that does not grow with the response.
//
// The scanners only look: they never hold, copy or change the bytes they
// are fed, so the client receives the upstream's bytes as they come.
//
// It imports nothing of sluice.
package respscan

import "bytes"

// Result is what a scan found for the paths it looks for.
type Result struct {
	// Found reports, per path, that a value was seen there.
	Found []bool
	// Values are the last integers seen, per path (valid where Valid).
	Values []int64
	// Valid reports, per path, that the last value seen there was a
	// non-negative JSON integer (no fraction, no exponent, no sign) that
	// fits an int64.
	Valid []bool
}

func newResult(n int) Result {
	return Result{Found: make([]bool, n), Values: make([]int64, n), Valid: make([]bool, n)}
}

// Sum adds up the valid values. ok is false when no path holds a value;
// invalid is true when a path's last value was not a valid count, in
// which case the sum is not to be used.
func (r Result) Sum() (sum int64, ok, invalid bool) {
	for i := range r.Found {
		if !r.Found[i] {
			continue
		}
		ok = true
		if !r.Valid[i] || sum > maxCount-r.Values[i] {
			invalid = true
			continue
		}
		sum += r.Values[i]
	}
	return sum, ok, invalid
}

// maxCount bounds a value and a sum: larger counts are invalid, so that
// no sum overflows (policy.MaxCount is far below it).
const maxCount = 1 << 53

// Bounds of the scanner's memory: the depth of containers it follows and
// the bytes of a key or a number it keeps. Deeper or longer ones are
// scanned past; they cannot be a path's.
const (
	maxDepth  = 64
	maxKey    = 64
	maxNumber = 24
)

type state uint8

const (
	stValue      state = iota // a value is expected
	stValueOrEnd              // after '[': a value or ']'
	stKeyOrEnd                // after '{': a key or '}'
	stKey                     // after ',' in an object: a key
	stInKey                   // in a key's string
	stColon                   // after a key: ':'
	stAfter                   // after a value: ',' or the container's end
	stInString                // in a string value
	stNumber                  // in a number
	stLiteral                 // in true, false or null
	stDone                    // the document ended: only white space
	stFailed                  // not JSON: nothing more is read
)

// frame is one open container: an object with the key being read or its
// value, or an array.
type frame struct {
	object bool
	key    [maxKey]byte
	keyLen int  // bytes of key kept
	keyBad bool // longer than maxKey, or with an escape it cannot keep
}

// JSON scans one JSON document for integers at paths of object keys
// from its root. The zero value is not usable; see NewJSON.
type JSON struct {
	paths [][]string
	res   Result

	st     state
	stack  [maxDepth]frame
	depth  int // open containers, including those deeper than maxDepth
	target int // the path of the value being read, or -1
	esc    int // in a string: 0, 1 after '\', 2 to 5 in \uXXXX
	num    [maxNumber]byte
	numLen int
	numBad bool
}

// NewJSON returns a scanner for paths, each a list of keys from the root.
func NewJSON(paths [][]string) *JSON {
	j := &JSON{paths: paths, res: newResult(len(paths)), target: -1}
	return j
}

// Result is what the scan found so far.
func (j *JSON) Result() Result { return j.res }

// Failed reports that the document is not JSON (from the first byte that
// showed it; what was found before stands).
func (j *JSON) Failed() bool { return j.st == stFailed }

// Complete reports that one whole JSON value was read.
func (j *JSON) Complete() bool { return j.st == stDone }

// End tells the scanner the document ended: a number at its very end is
// complete.
func (j *JSON) End() {
	if j.st == stNumber && j.depth == 0 {
		j.endNumber()
		j.st = stDone
	}
}

// Write scans p. It never fails: a document that is not JSON stops the
// scan. It returns len(p), nil, so that it can stand behind an
// io.MultiWriter.
func (j *JSON) Write(p []byte) (int, error) {
	for i := 0; i < len(p); i++ {
		if j.st == stFailed {
			break
		}
		if j.st == stInString && j.esc == 0 {
			// The bulk of a body is the text of strings: skip to what ends
			// or escapes one without the state machine. (Control
			// characters in a string are not looked for: the scan reads
			// JSON, it does not judge it.)
			rest := p[i:]
			end := bytes.IndexByte(rest, '"')
			if end < 0 {
				end = len(rest)
			}
			if esc := bytes.IndexByte(rest[:end], '\\'); esc >= 0 {
				end = esc
			}
			if i += end; i == len(p) {
				break
			}
		}
		j.step(p[i])
	}
	return len(p), nil
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// step feeds one byte.
func (j *JSON) step(c byte) {
	switch j.st {
	case stValue, stValueOrEnd:
		switch {
		case isSpace(c):
		case c == ']' && j.st == stValueOrEnd:
			j.pop()
		default:
			j.value(c)
		}
	case stKeyOrEnd, stKey:
		switch {
		case isSpace(c):
		case c == '}' && j.st == stKeyOrEnd:
			j.pop()
		case c == '"':
			f := j.top()
			if f != nil {
				f.keyLen, f.keyBad = 0, false
			}
			j.st, j.esc = stInKey, 0
		default:
			j.st = stFailed
		}
	case stInKey:
		j.keyByte(c)
	case stColon:
		switch {
		case isSpace(c):
		case c == ':':
			j.st = stValue
		default:
			j.st = stFailed
		}
	case stAfter:
		j.after(c)
	case stInString:
		switch {
		case j.esc == 1:
			j.esc = 0
			if c == 'u' {
				j.esc = 2
			}
		case j.esc >= 2:
			j.hexDigit(c)
		case c == '\\':
			j.esc = 1
		case c == '"':
			j.endValue()
		}
	case stNumber:
		if c >= '0' && c <= '9' || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E' {
			if j.numLen < maxNumber {
				j.num[j.numLen] = c
				j.numLen++
			} else {
				j.numBad = true
			}
			return
		}
		j.endNumber()
		j.after(c)
	case stLiteral:
		if c >= 'a' && c <= 'z' {
			return
		}
		j.endValue()
		j.after(c)
	case stDone:
		if !isSpace(c) {
			j.st = stFailed
		}
	}
}

// value starts a value with its first byte c.
func (j *JSON) value(c byte) {
	j.target = j.match()
	switch {
	case c == '{' || c == '[':
		if j.target >= 0 {
			j.seen(0, false) // a container is not a count
		}
		j.push(c == '{')
	case c == '"':
		if j.target >= 0 {
			j.seen(0, false)
		}
		j.st, j.esc = stInString, 0
	case c == '-' || c >= '0' && c <= '9':
		j.num[0], j.numLen, j.numBad = c, 1, false
		j.st = stNumber
	case c == 't' || c == 'f' || c == 'n':
		if j.target >= 0 {
			j.seen(0, false)
		}
		j.st = stLiteral
	default:
		j.st = stFailed
	}
}

// endNumber records the number just read, when it is at a path.
func (j *JSON) endNumber() {
	if j.target >= 0 {
		v, ok := parseCount(j.num[:j.numLen])
		j.seen(v, ok && !j.numBad)
	}
	j.endValue()
}

// parseCount parses a non-negative decimal integer without sign,
// fraction or exponent, up to maxCount.
func parseCount(b []byte) (int64, bool) {
	if len(b) == 0 || len(b) > 1 && b[0] == '0' {
		return 0, false
	}
	var v int64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		if v = v*10 + int64(c-'0'); v > maxCount {
			return 0, false
		}
	}
	return v, true
}

// seen records a value at the current target.
func (j *JSON) seen(v int64, valid bool) {
	t := j.target
	j.res.Found[t], j.res.Values[t], j.res.Valid[t] = true, v, valid
}

// endValue ends a scalar value (or, through pop, a container).
func (j *JSON) endValue() {
	j.target = -1
	if j.depth == 0 {
		j.st = stDone
		return
	}
	j.st = stAfter
}

// after handles a byte after a value.
func (j *JSON) after(c byte) {
	if j.st == stDone {
		if !isSpace(c) {
			j.st = stFailed
		}
		return
	}
	switch {
	case isSpace(c):
	case c == ',':
		if j.inObject() {
			j.st = stKey
		} else {
			j.st = stValue
		}
	case c == '}' && j.inObject(), c == ']' && !j.inObject(),
		(c == '}' || c == ']') && j.depth > maxDepth:
		j.pop()
	case c == ':' && j.depth > maxDepth:
		j.st = stValue // a key read as a value, below what the scan follows
	default:
		j.st = stFailed
	}
}

func (j *JSON) top() *frame {
	if j.depth == 0 || j.depth > maxDepth {
		return nil
	}
	return &j.stack[j.depth-1]
}

// inObject reports whether the innermost container is an object. Below
// maxDepth, containers are not told apart: the scan treats them as
// arrays, whose values are never a path's, and a '}' there still closes
// one level (the document is not checked that deep).
func (j *JSON) inObject() bool {
	if f := j.top(); f != nil {
		return f.object
	}
	return false
}

func (j *JSON) push(object bool) {
	if j.depth < maxDepth {
		j.stack[j.depth] = frame{object: object}
	}
	j.depth++
	j.target = -1
	if object {
		j.st = stKeyOrEnd
	} else {
		j.st = stValueOrEnd
	}
}

func (j *JSON) pop() {
	j.depth--
	j.endValue()
}

// keyByte reads one byte of a key, keeping it when it is short enough.
func (j *JSON) keyByte(c byte) {
	f := j.top()
	keep := func(b byte) {
		if f == nil {
			return
		}
		if f.keyLen == maxKey {
			f.keyBad = true
			return
		}
		f.key[f.keyLen] = b
		f.keyLen++
	}
	switch {
	case j.esc == 1:
		j.esc = 0
		switch c {
		case '"', '\\', '/':
			keep(c)
		case 'u':
			// Keys of paths are [A-Za-z0-9_-]: a \u escape keeps the key
			// from matching rather than be decoded.
			j.esc = 2
			if f != nil {
				f.keyBad = true
			}
		case 'b', 'f', 'n', 'r', 't':
			keep('?') // never part of a path's key
			if f != nil {
				f.keyBad = true
			}
		default:
			j.st = stFailed
		}
	case j.esc >= 2:
		j.hexDigit(c)
	case c == '\\':
		j.esc = 1
	case c == '"':
		j.st = stColon
	case c < 0x20:
		j.st = stFailed
	default:
		keep(c)
	}
}

// hexDigit reads one of the four digits of a \u escape in a string.
func (j *JSON) hexDigit(c byte) {
	if !isHex(c) {
		j.st = stFailed
		return
	}
	if j.esc++; j.esc == 6 {
		j.esc = 0
	}
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

// match returns the path the value about to start is at, or -1: every
// open container an object, and their keys the path's.
func (j *JSON) match() int {
	if j.depth == 0 || j.depth > maxDepth {
		return -1
	}
	for i := 0; i < j.depth; i++ {
		if f := &j.stack[i]; !f.object || f.keyBad {
			return -1
		}
	}
next:
	for t, p := range j.paths {
		if len(p) != j.depth {
			continue
		}
		for i, k := range p {
			f := &j.stack[i]
			if string(f.key[:f.keyLen]) != k {
				continue next
			}
		}
		return t
	}
	return -1
}
