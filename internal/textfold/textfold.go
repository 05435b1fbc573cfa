// Package textfold holds the case folding that e-mail canonicalisation
// (hashing) and path matching (policy) share, so that both read text as
// the most lenient of the readers they stand in front of.
//
// It imports nothing of sluice.
package textfold

import (
	"strings"
	"unicode"
)

// LowerUpper lowers the decomposed (NFD or NFKD) text s: each character
// to the lower case of its upper case (so ı and I, ſ and S, the Kelvin
// sign and K are one), a combining mark only to its lower case, and a dot
// above (U+0307) dropped after a letter that already has its dot (a
// Soft_Dotted base such as i or j, so İ is i). U+0345, the one mark with
// an upper case, upper-cases to a letter (U+0399); lowered, that would be
// a letter after its base rather than a mark on it, and NFKC could no
// longer compose it: "ή" followed by U+0345 would differ from "ῄ".
func LowerUpper(s string) string {
	var b strings.Builder
	b.Grow(len(s))
	softDotted := false // the current base letter is Soft_Dotted
	for _, r := range s {
		switch {
		case r == '\u0307' && softDotted:
			continue
		case unicode.Is(unicode.M, r):
			b.WriteRune(unicode.ToLower(r))
		default:
			r = Rune(r)
			softDotted = unicode.Is(unicode.Soft_Dotted, r)
			b.WriteRune(r)
		}
	}
	return b.String()
}

// Rune is the lower case of r's upper case, as LowerUpper lowers a base
// character: ı and I are i, ſ is s, the Kelvin sign is k, and İ is i
// (LowerUpper drops the dot above that NFD gives it; a single rune has
// none to drop).
func Rune(r rune) rune {
	return unicode.ToLower(unicode.ToUpper(r))
}
