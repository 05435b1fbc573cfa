// Package jsontext holds what sluice's readers of JSON text share beyond
// encoding/json: a walker over text that json.Valid accepted, the check
// for unpaired surrogate escapes, which encoding/json replaces instead of
// refusing, the folding under which two member names are one, and Decode,
// the strict decoder of a request body. proxy/identity reads an e-mail
// from a JSON body with it, jwt the header and claims of a token, admin
// the bodies of its writes.
//
// It imports nothing of sluice.
package jsontext

// Walker steps through JSON text that json.Valid accepted: B is the text,
// I the offset of the next byte to read. Every method still checks
// bounds, so a bug of its caller's cannot make it panic; it would only
// misread, which its callers' differential fuzz tests against
// encoding/json guard.
type Walker struct {
	B []byte
	I int
}

// Next skips white space and returns the next byte, or 0 at the end.
func (w *Walker) Next() byte {
	for w.I < len(w.B) {
		switch c := w.B[w.I]; c {
		case ' ', '\t', '\r', '\n':
			w.I++
		default:
			return c
		}
	}
	return 0
}

// String consumes the string whose opening '"' is at I, returning it
// with its quotes, and whether it holds an escape (which encoding/json
// then unescapes); ok is false when the text ends first.
func (w *Walker) String() (raw []byte, escaped, ok bool) {
	start := w.I
	for w.I++; w.I < len(w.B); w.I++ {
		switch w.B[w.I] {
		case '\\':
			escaped = true
			w.I++ // the escaped byte cannot end the string
		case '"':
			w.I++
			return w.B[start:w.I], escaped, true
		}
	}
	return nil, escaped, false
}

// LoneSurrogate reports whether the JSON text data holds a \u escape of a
// surrogate (U+D800–U+DFFF) that is not a high surrogate followed at once
// by an escaped low one ("\ud800", "\udc00\ud800"). encoding/json and
// JavaScript replace or keep such a value where Python and PHP refuse it,
// so two readers would read two values from it. A \u escape without four
// hex digits, which json.Valid rules out, counts as one too.
func LoneSurrogate(data []byte) bool {
	for i := 0; i < len(data); i++ {
		if data[i] != '\\' {
			continue
		}
		i++
		if i >= len(data) || data[i] != 'u' {
			continue // a one-character escape, "\\" included; the loop steps past it
		}
		r, ok := hex4(data, i+1)
		if !ok {
			return true
		}
		i += 4
		switch {
		case r < 0xD800 || r > 0xDFFF:
		case r >= 0xDC00:
			return true // a low surrogate first
		default:
			lo, ok := hex4(data, i+3)
			if i+2 >= len(data) || data[i+1] != '\\' || data[i+2] != 'u' || !ok || lo < 0xDC00 || lo > 0xDFFF {
				return true
			}
			i += 6
		}
	}
	return false
}

// hex4 decodes the four hex digits at data[i:].
func hex4(data []byte, i int) (rune, bool) {
	if i < 0 || i+4 > len(data) {
		return 0, false
	}
	var r rune
	for _, c := range data[i : i+4] {
		switch {
		case '0' <= c && c <= '9':
			r = r<<4 | rune(c-'0')
		case 'a' <= c && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case 'A' <= c && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}
