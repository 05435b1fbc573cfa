package hashing

import (
	"errors"
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"

	"github.com/sluicehq/sluice/internal/textfold"
)

// The errors of CanonicalEmail and CanonicalText. They describe what is
// wrong with a value without quoting it, so a caller can put them in a
// message that names its field: `field "email" holds a control character`.
//
// Each marks a value that some upstream reads as another value: Java's
// String.trim removes every C0 control from the ends, JavaScript's trim
// removes U+FEFF, many applications drop zero-width characters and soft
// hyphens, and a decoder may replace or skip invalid bytes. A key computed
// from such a value would be a fresh key for a request the upstream serves
// as the plain address, so these values are refused rather than hashed.
var (
	ErrInvalidUTF8 = errors.New("is not valid UTF-8")
	ErrControl     = errors.New("holds a control character")
	ErrInvisible   = errors.New("holds an invisible format character")
)

// CanonicalText returns s with leading and trailing Unicode White_Space
// removed, and nothing else changed (case is kept). It is the canonical form
// of a tenant id or a header(...) identity.
//
// It returns ErrInvalidUTF8 when s is not valid UTF-8, ErrControl when what
// is left after trimming holds a C0 or C1 control character (U+0000–U+001F,
// U+007F–U+009F: a tab between two words, say), and ErrInvisible when it
// holds a format character (general category Cf: U+200B ZERO WIDTH SPACE,
// U+FEFF, U+00AD SOFT HYPHEN, the bidirectional controls, ...). The White_Space
// controls (tab, line feed, U+0085 and their kind) are trimmed from the
// ends first; inside the value they are refused like every other control.
//
// The result is stable: CanonicalText of a result is the result.
func CanonicalText(s string) (string, error) {
	if !utf8.ValidString(s) {
		return "", ErrInvalidUTF8
	}
	s = strings.TrimSpace(s) // Unicode White_Space, with an ASCII fast path
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c < 0x20 || c == 0x7f {
				return "", ErrControl
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r <= 0x9f:
			return "", ErrControl
		case unicode.Is(unicode.Cf, r):
			return "", ErrInvisible
		}
		i += size
	}
	return s, nil
}

// CanonicalEmail returns the canonical spelling of an email address (or any
// identifier given as free text), so that every spelling a user, a browser
// or an IME might produce for the same address shares one key.
//
// The steps, in this order:
//
//  1. CanonicalText: leading and trailing Unicode White_Space are trimmed,
//     and a value that is not valid UTF-8 or still holds a control or format
//     character is refused with its error (see CanonicalText for why).
//  2. Unicode NFKC, with the letters lowered in between its decomposition
//     and its composition. NFKC maps compatibility characters to their plain
//     forms: fullwidth letters and "＠" (U+FF20) become ASCII, and
//     compatibility spaces such as NBSP (U+00A0) or the ideographic space
//     (U+3000) become U+0020. Lowering the decomposed value lowers the
//     letters NFKC produces too (fullwidth "Ｖ" becomes "V", then "v"), and
//     sees every letter apart from its marks.
//  3. Lower-casing, each letter to the lower case of its upper case
//     (Unicode simple case mappings). Lowering the upper case, rather than
//     the letter itself, also merges the lower-case letters that share an
//     upper case, as a comparison that ignores case does (Java's
//     equalsIgnoreCase, Go's strings.EqualFold): final sigma "ς" and "σ"
//     (both "Σ"), dotless "ı" and "i" (both "I"). A dot above on a letter
//     that already has its dot (i, j) is dropped, so "İ", which lowers to
//     "i" in Go and to "i" with a dot above in Java, JavaScript and Python,
//     is "i" however it was lowered or normalised.
//     Steps 2 and 3 repeat until the value no longer changes, because
//     composition can make what lowering must see again (and the reverse).
//  4. Trimming of leading and trailing White_Space once more, because some
//     characters decompose into a space followed by a combining mark (U+00B4
//     ACUTE ACCENT), so the value is only stable once that space is gone.
//
// The result is stable: CanonicalEmail(CanonicalEmail(s)) == CanonicalEmail(s),
// with no error. ASCII input takes a fast path that only trims and
// lower-cases, which is what the steps above amount to for ASCII.
//
// Provider-specific aliasing is deliberately not undone: "+tags" are kept,
// and dots in Gmail local parts are kept. Whether a+x@example.com and
// a@example.com are one account is the upstream's decision, and sluice must
// not count two accounts the upstream keeps apart as one (letting one user
// exhaust another's limit), nor guess at rules that differ per provider.
// The local part is lower-cased although RFC 5321 allows it to be case
// sensitive, because virtually every provider and application treats it
// case-insensitively, and an attacker varying case must not get a fresh key.
func CanonicalEmail(s string) (string, error) {
	s, err := CanonicalText(s)
	if err != nil {
		return "", err
	}
	if emailIsASCII(s) {
		return strings.ToLower(s), nil
	}
	// The second round finds nothing left to change for every input
	// FuzzCanonicalEmail has tried; the bound is a guard.
	for range 4 {
		next := norm.NFKC.String(textfold.LowerUpper(norm.NFKD.String(s)))
		if next == s {
			break
		}
		s = next
	}
	return strings.TrimFunc(s, unicode.IsSpace), nil
}

// emailIsASCII reports whether s is entirely ASCII.
func emailIsASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return false
		}
	}
	return true
}
