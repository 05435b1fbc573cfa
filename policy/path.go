package policy

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/cases"
	"golang.org/x/text/unicode/norm"

	"github.com/sluicehq/sluice/internal/textfold"
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

// CheckTarget reports whether a request target may be matched at all: the
// target as the client sent it on the request line, or as a proxy
// describes it (X-Forwarded-Uri, X-Original-URI), path and query. A raw
// "#" may not be in it. A client never sends a fragment, so one there is
// a probe, and servers disagree on what it means: browsers and URL parsers
// end the path at it, while Go's server and most proxies keep it as part of
// the path, so "/api/x#/../secret" is /api/secret to one upstream and
// /api/x to another. sluice cannot know which path the upstream serves and
// refuses the target (400). Errors are *PathError and match
// ErrInvalidPath.
func CheckTarget(target string) error {
	if i := strings.IndexByte(target, '#'); i >= 0 {
		return &PathError{Offset: i, Reason: `raw "#" in the request target`}
	}
	return nil
}

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
//     Tomcat), one made only of dots and White_Space (".. ", "...",
//     "..%C2%A0", which Windows servers and trimming readers make ".." or
//     "."), one that is a dot segment with an NTFS stream suffix
//     ("..::$INDEX_ALLOCATION"), and one that holds one once compatibility
//     forms are folded as MatchPath folds them (fullwidth "．．", the two
//     dot leader "‥", "／.."). So is a ".." after a segment that MatchPath
//     reads as several ("b%2Fc", "b\c") or as none ("%20", ";x"): here
//     ".." removes the whole segment, and to an upstream that splits or
//     drops it, a piece of it or the segment before it. sluice cannot
//     know which of these the upstream climbs with, so it refuses them
//     rather than match the request under a path the upstream may not
//     serve.
//   - A segment that holds, once decoded, an overlong or surrogate UTF-8
//     encoding ("%C0%AE", "%C0%AF") is an error: strict decoders refuse it
//     or make it U+FFFD, lenient ones read a "." or a "/".
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
			if reason := disguisedSegment(p[rawSeg:i], out[seg:]); reason != "" {
				return "", &PathError{Offset: rawSeg, Reason: reason}
			}
			if string(out[seg:]) == ".." && seg > 1 && !oneSegment(out[bytes.LastIndexByte(out[:seg-1], '/')+1:seg-1]) {
				// "/a/b%2Fc/.." is "/a/" here, where ".." removes the
				// segment "b%2Fc", and "/a/b" to an upstream that decodes
				// %2F; "/a/%20/.." is "/a/" here, and "/" to one that
				// drops the blank segment first.
				return "", &PathError{Offset: rawSeg, Reason: `".." after a segment that some upstream reads as none or several`}
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

// disguisedSegment says why a segment, raw as written and with the
// escapes of unreserved characters decoded (dec), cannot be matched as the
// upstream will read it, or returns "": see CanonicalPath. Plain "." and
// ".." are real dot segments, which endSegment removes.
func disguisedSegment(raw string, dec []byte) string {
	if raw == "." || raw == ".." {
		return ""
	}
	if bytes.IndexByte(dec, '.') < 0 && bytes.IndexByte(dec, '%') < 0 {
		return "" // nothing that is or decodes to a dot: the common case
	}
	var buf [stackPath]byte
	d := decodeAll(buf[:0], dec)
	if !isASCII(d) {
		var lenient bool
		if d, lenient = foldText(d); lenient {
			return "overlong or surrogate UTF-8 encoding"
		}
	}
	for len(d) > 0 {
		var piece []byte
		if piece, d = cutSegment(d); isDotsAndSpaces(trimStream(piece)) {
			return "encoded or disguised dot segment"
		}
	}
	return ""
}

// oneSegment reports whether MatchPath reads a canonical segment as one
// segment, so that a ".." after it removes there what it removes here. It
// reads one as several when it holds a "/" or "\" once decoded or folded
// ("b%2Fc", "b%5Cc", "b\c", "b／c"), and as none when it is only ";"
// parameters, white space or a stream suffix ("%20", ";x", "::$DATA").
func oneSegment(seg []byte) bool {
	m := MatchPath("/" + string(seg))
	return m != "/" && strings.IndexByte(m[1:], '/') < 0
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

// isDotsAndSpaces reports whether s is made of dots and Unicode
// White_Space only, with at least one dot.
func isDotsAndSpaces(s []byte) bool {
	return bytes.IndexByte(s, '.') >= 0 && len(trimDotsAndSpace(s)) == 0
}

// trimDotsAndSpace cuts the dots and Unicode White_Space that end s: the
// characters Windows drops from the end of a file name, and the blanks
// any trimming reader drops.
func trimDotsAndSpace(s []byte) []byte {
	for len(s) > 0 {
		if c := s[len(s)-1]; c < utf8.RuneSelf {
			if c != '.' && c != ' ' && (c < '\t' || c > '\r') {
				return s // the common case, in a byte
			}
			s = s[:len(s)-1]
			continue
		}
		r, n := utf8.DecodeLastRune(s)
		if !unicode.IsSpace(r) {
			return s
		}
		s = s[:len(s)-n]
	}
	return s
}

// trimStream cuts an NTFS stream suffix off a segment: from the first ":"
// on, when a ":$" follows (the segment names an attribute type, such as
// "x::$DATA", "x:$DATA", "x:$I30:$INDEX_ALLOCATION" or "x:name:$DATA").
// Windows serves "x::$DATA" as x and "x::$INDEX_ALLOCATION" as the directory
// x; a stream of another name is cut too, since merging two paths only
// shares a limit. A ":" with no "$" after it ("/v1/x:batchGet") is kept. It
// expects folded text, in which fullwidth ":" and "$" are ASCII; type names
// need no case folding, as only "$" is looked for.
func trimStream(s []byte) []byte {
	if i := bytes.IndexByte(s, ':'); i >= 0 && bytes.Contains(s[i:], []byte(":$")) {
		return s[:i]
	}
	return s
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
//   - Case and compatibility forms are folded (see foldText): "I", "ı",
//     "İ" and fullwidth "Ｉ" are all "i", "ſ" is "s", the Kelvin sign is
//     "k", "ß" is "ss", and the fullwidth solidus "／" is a "/", as readers
//     that ignore case (Java's equalsIgnoreCase, JavaScript's /iu, Go's
//     strings.EqualFold, Python's casefold) or normalise (NFKC, IIS) would
//     read them. Invalid UTF-8 becomes U+FFFD, byte by byte.
//   - "\" is a "/" (IIS and some frameworks treat it so).
//   - Every segment loses its ";" parameters, so "/api/login;jsessionid=x"
//     is "/api/login", as Tomcat reads it.
//   - Every segment loses its trailing dots and Unicode White_Space, as IIS
//     and Windows file systems drop them and trimming readers drop blanks:
//     "/api/login.", "/api/login%20" and "/api/login%C2%A0" are
//     "/api/login". (A format suffix such as ".json" is kept; a rule whose
//     last segment has no dot matches it, see Rule.Matches.)
//   - Every segment loses an NTFS stream suffix (see trimStream):
//     "/admin::$DATA/x" and "/admin::$INDEX_ALLOCATION/x" are "/admin/x",
//     as Windows serves them.
//   - Repeated slashes are collapsed and dot segments removed again, since
//     decoding may have produced new ones; ".." never climbs above the
//     root.
//   - A trailing slash is removed, except from "/" itself.
//
// The result starts with "/" and MatchPath(result) == result. It is not an
// escaped path: it may hold any byte, including "%" and "?", and is only
// meant to be compared. MatchPath accepts any string; a path that does not
// start with "/" is read as if it did. A path that is ASCII once decoded,
// the common case, is only lower-cased, without allocating more than the
// result.
func MatchPath(canonical string) string {
	var decBuf, outBuf [stackPath]byte
	dec := decodeAll(decBuf[:0], canonical)
	ascii := isASCII(dec)
	if !ascii {
		dec, _ = foldText(dec)
	}
	out := outBuf[:0]
	for len(dec) > 0 {
		var s []byte
		if s, dec = cutSegment(dec); !isDotsOnly(s) {
			s = trimDotsAndSpace(s)
			if t := trimStream(s); len(t) != len(s) {
				s = trimDotsAndSpace(t)
			}
		}
		switch {
		case len(s) == 0 || len(s) == 1 && s[0] == '.':
		case len(s) == 2 && s[0] == '.' && s[1] == '.':
			out = out[:max(0, bytes.LastIndexByte(out, '/'))]
		case ascii:
			out = appendLowerASCII(append(out, '/'), s)
		default: // folded already
			out = append(append(out, '/'), s...)
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

// foldCase is Unicode full case folding (CaseFolding.txt, statuses C and
// F). A cases.Caser from Fold is stateless and safe for concurrent use.
var foldCase = cases.Fold()

// foldText folds a decoded path (see decodeAll) that is not all ASCII, so
// that every spelling that some reader that ignores case or normalises
// compatibility forms takes for the same text is the same text. Each
// round, until nothing changes:
//
//  1. Invalid UTF-8 becomes U+FFFD, byte by byte.
//  2. NFKD: compatibility forms are replaced (fullwidth "Ａ" is "A", "／"
//     is "/", the no-break space a space, "ﬁ" is "fi"), and letters are
//     parted from their marks.
//  3. Each letter becomes the lower case of its upper case (Unicode simple
//     case mappings), as Java's equalsIgnoreCase compares: "ı" is "i" (both
//     upper-case to "I", although case folding keeps "ı" apart), "ς" is
//     "σ". A dot above on a letter that has its dot already (Soft_Dotted,
//     such as i) is dropped, so "İ" is "i", as Java and Python's re read it,
//     rather than "i" with a dot. hashing.CanonicalEmail lowers emails alike.
//  4. Unicode full case folding (golang.org/x/text/cases.Fold): "ß" is
//     "ss", "ſ" is "s", the Kelvin sign is "k", as Go's strings.EqualFold,
//     JavaScript's /iu and Python's casefold read them.
//  5. NFKC, so that the text is in one composition whatever the steps above
//     made of it.
//  6. Percent-escapes are decoded again: NFKC makes "％４１" "%41".
//
// Each round's output is the next one's input, and the rounds stop at the
// first that changes nothing, so that foldText of its own result changes
// nothing; two rounds suffice for every input the fuzz targets have found,
// and the bound of eight is a guard. lenient reports whether the text held
// an overlong or surrogate UTF-8 encoding (such as %C0%AE, a dot to old
// lenient decoders), which no reader agrees on.
func foldText(d []byte) (folded []byte, lenient bool) {
	s := string(d)
	for range 8 {
		lenient = lenient || hasLenientUTF8(s)
		valid := s
		if !utf8.ValidString(valid) {
			valid = replaceInvalid(valid)
		}
		next := string(decodeAll(nil, norm.NFKC.String(foldCase.String(textfold.LowerUpper(norm.NFKD.String(valid))))))
		if next == s {
			break
		}
		s = next
	}
	return []byte(s), lenient
}

// replaceInvalid replaces each byte of s that is not part of valid UTF-8
// with U+FFFD, as strings.ToLower does.
func replaceInvalid(s string) string {
	var b strings.Builder
	b.Grow(len(s) + 8)
	for _, r := range s {
		b.WriteRune(r)
	}
	return b.String()
}

// hasLenientUTF8 reports whether s holds a byte sequence that strict UTF-8
// refuses but lenient decoders read as a character: an overlong encoding
// (C0 AE is "." to them) or an encoded surrogate (CESU-8, which Java's
// modified UTF-8 reads).
func hasLenientUTF8(s string) bool {
	for i := 0; i+1 < len(s); i++ {
		switch c, n := s[i], s[i+1]; {
		case c == 0xC0 || c == 0xC1: // overlong two-byte form of ASCII
			return true
		case c == 0xE0 && n < 0xA0 && n >= 0x80, // overlong three-byte form
			c == 0xF0 && n < 0x90 && n >= 0x80,  // overlong four-byte form
			c == 0xED && n >= 0xA0 && n <= 0xBF: // a surrogate
			return true
		}
	}
	return false
}

// isASCII reports whether every byte of s is ASCII.
func isASCII(s []byte) bool {
	for _, c := range s {
		if c >= utf8.RuneSelf {
			return false
		}
	}
	return true
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

// appendLowerASCII appends the ASCII text s to dst in lower case.
func appendLowerASCII(dst, s []byte) []byte {
	for _, c := range s {
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		dst = append(dst, c)
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
