package hashing

import (
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// CanonicalEmail returns the canonical spelling of an email address (or any
// identifier given as free text), so that every spelling a user, a browser
// or an IME might produce for the same address shares one key.
//
// The steps, in this order:
//
//  1. Invalid UTF-8 is replaced by U+FFFD, so the result is always valid
//     UTF-8 and later steps cannot treat the same bytes differently.
//  2. Unicode NFKC. It runs first because it maps compatibility characters
//     to their plain forms: fullwidth letters and "＠" (U+FF20) become ASCII,
//     and compatibility spaces such as NBSP (U+00A0) or the ideographic
//     space (U+3000) become U+0020. Some characters decompose into a space
//     followed by a combining mark (U+00B4 ACUTE ACCENT), so trimming before
//     NFKC would not be stable.
//  3. Lower-casing with Unicode simple case mapping (strings.ToLower), after
//     NFKC so that the letters NFKC produced are lowered too (fullwidth "Ｖ"
//     becomes "V", then "v"). If lowering left the string outside NFKC, it
//     is normalised again.
//  4. Trimming of leading and trailing Unicode White_Space, last, so that
//     whitespace produced by the earlier steps is removed as well.
//
// The result is stable: CanonicalEmail(CanonicalEmail(s)) ==
// CanonicalEmail(s). ASCII input takes a fast path that only trims and
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
func CanonicalEmail(s string) string {
	if emailIsASCII(s) {
		return strings.ToLower(strings.TrimSpace(s))
	}
	s = strings.ToValidUTF8(s, "\uFFFD")
	s = norm.NFKC.String(s)
	s = strings.ToLower(s)
	if !norm.NFKC.IsNormalString(s) {
		s = norm.NFKC.String(s)
	}
	return strings.TrimFunc(s, unicode.IsSpace)
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
