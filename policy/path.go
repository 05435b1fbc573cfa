package policy

import (
	"bytes"
	"errors"
	"fmt"
	"unicode"
	"unicode/utf8"
)

// Request paths have two forms.
//
// The canonical form (CanonicalPath) is what sluice forwards to the
// upstream. It only normalises what RFC 3986 section 6.2.2 says never
// changes a URI's meaning, plus repeated slashes, so an upstream sees the
// request it was sent in a single spelling.
//
// The match form (MatchPath) is what rules are matched against. It is
// deliberately coarser than any upstream: every spelling that some upstream
// might treat as the same resource (decoded %2F, double encoding, case,
// trailing slashes, ";" parameters, backslashes) maps to one string. Merging
// too much only means that two paths share a rule's limit; merging too
// little would let a client escape a limit by respelling the path.

// ErrInvalidPath is what every error of CanonicalPath matches with
// errors.Is. A proxy answers such requests with 400.
var ErrInvalidPath = errors.New("invalid path")

// PathError describes why CanonicalPath rejected a path. It never quotes
// the path itself, which may carry identifiers.
type PathError struct {
	Offset int    // byte offset of the problem in the escaped path
	Reason string // what is wrong there, such as "malformed percent-escape"
}

// Error returns "invalid path: <reason> at byte <offset>".
func (e *PathError) Error() string {
	return fmt.Sprintf("invalid path: %s at byte %d", e.Reason, e.Offset)
}

// Is reports whether target is ErrInvalidPath.
func (e *PathError) Is(target error) bool { return target == ErrInvalidPath }

// stackPath is the size of the on-stack buffers that CanonicalPath and
// MatchPath build their results in; longer paths cost an extra allocation.
const stackPath = 256

// CanonicalPath returns the canonical form of a request's escaped path
// (r.URL.EscapedPath() or the path part of the request target, without the
// query). The canonical form is what sluice matches (through MatchPath) and
// what the upstream receives, so the two cannot disagree.
//
// It is built as follows:
//   - The path must start with "/". Anything else, including the "*" of
//     OPTIONS * and an empty path, is an error.
//   - Percent-escapes of unreserved characters (A-Z a-z 0-9 - . _ ~) are
//     decoded, because RFC 3986 makes them equivalent to the character;
//     every other escape is kept with upper-case hex digits.
//   - A malformed percent-escape ("%", "%4", "%zz") is an error, as is a
//     control character (0x00-0x1F, 0x7F), raw or percent-encoded: no
//     upstream should see a NUL or a line break in a path.
//   - Raw bytes that RFC 3986 does not allow in a path (space, '"', '<',
//     '>', '\', '^', '`', '{', '|', '}', '[', ']', '#', '?', and every byte
//     from 0x80) are percent-encoded, much as url.URL.EscapedPath would
//     have done, so the result is always a valid escaped path.
//   - Repeated slashes are collapsed into one.
//   - Dot segments, "." and ".." written as such, are removed as in RFC
//     3986 section 5.2.4; ".." never climbs above the root. A path ending
//     in "/." or "/.." ends in "/", as in the RFC.
//   - A segment that some upstream would read as a dot segment although it
//     is not written as one is an error: one that decodes to one ("%2e%2e",
//     also doubly encoded), one that holds one once "%2F", "%5C" or "\"
//     split it ("..%2F", "a%5C..") or its ";" parameters are cut ("..;x",
//     Tomcat), and one made only of dots and spaces (".. ", "...", which
//     Windows servers trim to ".." or "."). sluice cannot know which of
//     these the upstream climbs with, so it refuses them rather than match
//     the request under a path the upstream may not serve.
//   - Case, ";" parameters, a trailing slash and escapes of reserved
//     characters such as %2F are kept: they may mean something to the
//     upstream. MatchPath ignores them.
//
// The result starts with "/", contains no "//" and no "." or ".." segment,
// no segment MatchPath would read as one, and CanonicalPath(result) ==
// result. When escapedPath is already
// canonical it is returned as is, without allocating. Errors are
// *PathError and match ErrInvalidPath.
func CanonicalPath(escapedPath string) (string, error) {
	p := escapedPath
	if p == "" || p[0] != '/' {
		return "", &PathError{Offset: 0, Reason: `expected "/"`}
	}
	var stack [stackPath]byte
	// out always ends in "/" between segments; see endSegment.
	out := append(stack[:0], '/')
	seg := len(out) // start of the current segment in out
	trailing := false
	rawSeg := 1 // start of the current segment in p
	for i := 1; i <= len(p); i++ {
		if i == len(p) || p[i] == '/' {
			if hidesDotSegment(p[rawSeg:i], out[seg:]) {
				return "", &PathError{Offset: rawSeg, Reason: "encoded or disguised dot segment"}
			}
			out, trailing = endSegment(out, seg)
			seg = len(out)
			rawSeg = i + 1
			continue
		}
		c := p[i]
		switch {
		case c == '%':
			if i+2 >= len(p) || !isHex(p[i+1]) || !isHex(p[i+2]) {
				return "", &PathError{Offset: i, Reason: "malformed percent-escape"}
			}
			v := unhex(p[i+1])<<4 | unhex(p[i+2])
			if isControl(v) {
				return "", &PathError{Offset: i, Reason: "encoded control character"}
			}
			if isUnreserved(v) {
				out = append(out, v)
			} else {
				out = append(out, '%', upperHex[v>>4], upperHex[v&15])
			}
			i += 2
		case isControl(c):
			return "", &PathError{Offset: i, Reason: "control character"}
		case isPathChar(c):
			out = append(out, c)
		default:
			out = append(out, '%', upperHex[c>>4], upperHex[c&15])
		}
	}
	if !trailing && len(out) > 1 {
		out = out[:len(out)-1]
	}
	if string(out) == escapedPath {
		return escapedPath, nil
	}
	return string(out), nil
}

// hidesDotSegment reports whether a segment, raw as written and with the
// escapes of unreserved characters decoded (dec), would be a dot segment to
// some upstream without being one as written: see CanonicalPath. Plain "."
// and ".." are real dot segments, which endSegment removes.
func hidesDotSegment(raw string, dec []byte) bool {
	if raw == "." || raw == ".." {
		return false
	}
	if bytes.IndexByte(dec, '.') < 0 && bytes.IndexByte(dec, '%') < 0 {
		return false // nothing that is or decodes to a dot: the common case
	}
	var buf [stackPath]byte
	for d := decodeAll(buf[:0], dec); len(d) > 0; {
		var piece []byte
		if piece, d = cutSegment(d); isDotsAndSpaces(piece) {
			return true
		}
	}
	return false
}

// cutSegment cuts the first segment off a decoded path (see decodeAll) as
// the most lenient upstream splits one: at "/" or "\", without its ";"
// parameters. rest is what follows the separator.
func cutSegment(d []byte) (seg, rest []byte) {
	end := 0
	for end < len(d) && d[end] != '/' && d[end] != '\\' {
		end++
	}
	seg, rest = d[:end], d[min(end+1, len(d)):]
	if i := bytes.IndexByte(seg, ';'); i >= 0 {
		seg = seg[:i]
	}
	return seg, rest
}

// isDotsAndSpaces reports whether s is made of dots and spaces only, with
// at least one dot.
func isDotsAndSpaces(s []byte) bool {
	dot := false
	for _, c := range s {
		switch c {
		case '.':
			dot = true
		case ' ':
		default:
			return false
		}
	}
	return dot
}

// endSegment finishes the segment out[seg:], which follows a "/": an empty
// segment (from "//" or a trailing "/") and "." are dropped, ".." also
// drops the segment before it, and anything else is kept and followed by
// "/". trailing reports whether the path, if it ended here, ends in "/".
func endSegment(out []byte, seg int) (_ []byte, trailing bool) {
	switch s := out[seg:]; {
	case len(s) == 0:
		return out, true
	case len(s) == 1 && s[0] == '.':
		return out[:seg], true
	case len(s) == 2 && s[0] == '.' && s[1] == '.':
		out = out[:seg]
		if seg > 1 { // out is "/a/b/": cut back to "/a/"
			out = out[:bytes.LastIndexByte(out[:seg-1], '/')+1]
		}
		return out, true
	}
	return append(out, '/'), false
}

// MatchPath returns the match form of a canonical path (see CanonicalPath):
// the form that rules' paths are stored in and requests are matched in.
//
// It is built as follows, each step chosen because some upstream behaves
// that way:
//   - Every percent-escape is decoded, repeatedly, until none is left: %2F
//     becomes "/" (many servers and frameworks decode it before routing)
//     and %252F becomes "/" as well (some decode twice). Malformed escapes
//     are left as they are.
//   - "\" is a "/" (IIS and some frameworks treat it so).
//   - Every segment loses its ";" parameters, so "/api/login;jsessionid=x"
//     is "/api/login", as Tomcat reads it.
//   - Every segment loses its trailing dots and spaces, as IIS and Windows
//     file systems drop them: "/api/login." and "/api/login%20" are
//     "/api/login". (A format suffix such as ".json" is kept; a rule whose
//     last segment has no dot matches it, see Rule.Matches.)
//   - Repeated slashes are collapsed and dot segments removed again, since
//     decoding may have produced new ones; ".." never climbs above the
//     root.
//   - Letters are lower-cased (Unicode simple case mapping; invalid UTF-8
//     becomes U+FFFD, as strings.ToLower does), because some upstreams and
//     file systems ignore case.
//   - A trailing slash is removed, except from "/" itself.
//
// The result starts with "/" and MatchPath(result) == result. It is not an
// escaped path: it may hold any byte, including "%" and "?", and is only
// meant to be compared. MatchPath accepts any string; a path that does not
// start with "/" is read as if it did.
func MatchPath(canonical string) string {
	var decBuf, outBuf [stackPath]byte
	dec := decodeAll(decBuf[:0], canonical)
	out := outBuf[:0]
	for len(dec) > 0 {
		var s []byte
		if s, dec = cutSegment(dec); !isDotsOnly(s) {
			s = bytes.TrimRight(s, ". ")
		}
		switch {
		case len(s) == 0 || len(s) == 1 && s[0] == '.':
		case len(s) == 2 && s[0] == '.' && s[1] == '.':
			out = out[:max(0, bytes.LastIndexByte(out, '/'))]
		default:
			out = appendLower(append(out, '/'), s)
		}
	}
	if len(out) == 0 {
		return "/"
	}
	if string(out) == canonical {
		return canonical
	}
	return string(out)
}

// isDotsOnly reports whether s is "." or "..", the dot segments MatchPath
// resolves (and CanonicalPath only lets through as such).
func isDotsOnly(s []byte) bool {
	return len(s) == 1 && s[0] == '.' || len(s) == 2 && s[0] == '.' && s[1] == '.'
}

// decodeAll appends p to dst with every percent-escape decoded until no
// escape is left, in one pass: whenever the bytes written so far end in an
// escape, it is replaced by its byte, which may complete another escape
// ("%25" "41" gives "%41", then "A"). Rewriting "%XX" to its byte has no
// overlapping cases, so this gives the same result as decoding the whole
// string again and again, in linear instead of quadratic time.
func decodeAll[S string | []byte](dst []byte, p S) []byte {
	for i := 0; i < len(p); i++ {
		dst = append(dst, p[i])
		for n := len(dst); n >= 3 && dst[n-3] == '%' && isHex(dst[n-2]) && isHex(dst[n-1]); n = len(dst) {
			dst = append(dst[:n-3], unhex(dst[n-2])<<4|unhex(dst[n-1]))
		}
	}
	return dst
}

// appendLower appends s to dst in lower case, as strings.ToLower would.
func appendLower(dst, s []byte) []byte {
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if 'A' <= c && c <= 'Z' {
				c += 'a' - 'A'
			}
			dst = append(dst, c)
			i++
			continue
		}
		r, size := utf8.DecodeRune(s[i:])
		dst = utf8.AppendRune(dst, unicode.ToLower(r))
		i += size
	}
	return dst
}

const upperHex = "0123456789ABCDEF"

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case c <= '9':
		return c - '0'
	case c >= 'a':
		return c - 'a' + 10
	}
	return c - 'A' + 10
}

func isControl(c byte) bool { return c < 0x20 || c == 0x7f }

// isUnreserved reports whether c is an RFC 3986 unreserved character.
func isUnreserved(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
		c == '-' || c == '.' || c == '_' || c == '~'
}

// isPathChar reports whether c may appear raw in a path segment: an RFC
// 3986 pchar other than a percent-escape.
func isPathChar(c byte) bool {
	if isUnreserved(c) {
		return true
	}
	switch c {
	case '!', '$', '&', '\'', '(', ')', '*', '+', ',', ';', '=', ':', '@':
		return true
	}
	return false
}
