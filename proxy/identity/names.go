package identity

import (
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/sluicehq/sluice/internal/textfold"
)

// nameMatch is how a field name in a request relates to a configured field.
type nameMatch uint8

const (
	nameOther  nameMatch = iota // another field
	nameSame                    // the configured field
	nameNested                  // the field in array or hash syntax: "email[]", "email[a]"
)

// matchName compares the name of a field in a request (a query or form
// key, a multipart part's name, a JSON key) with the configured field, the
// way the most lenient common upstream would:
//
//   - White space is trimmed from both ends of the name. PHP drops leading
//     spaces, so " email" is "email" there; trailing ones are trimmed too,
//     since merging more spellings only makes sluice stricter.
//   - Letters match case-insensitively with Unicode simple folding
//     (strings.EqualFold), as encoding/json and many frameworks match keys:
//     "Email", "EMAIL" and "\u212Aontakt" (Kelvin sign) match; and, as
//     Java's equalsIgnoreCase compares, a letter matches the lower case
//     of its upper case, so the dotless ı and the dotted İ are i
//     ("EMA\u0130L" and "ema\u0131l" are "email"), as path matching and
//     e-mail canonicalisation read them (internal/textfold).
//   - ' ', '.' and '[' match '_', because PHP rewrites them so in the names
//     of query, form and multipart fields: ".method" and "[method" are
//     "_method" to Laravel and Symfony.
//   - A name with a "[...]" after the field ("email[]", "email[0]",
//     "email[x]") is the field as an array or hash for PHP, Rails and
//     Express (qs), which is nameNested: no string value sluice could count.
func matchName(name, field string) nameMatch {
	n := strings.TrimSpace(name)
	if i := strings.IndexByte(n, '['); i >= 0 && strings.IndexByte(n[i+1:], ']') >= 0 {
		if nameEqual(strings.TrimSpace(n[:i]), field) {
			return nameNested
		}
		return nameOther
	}
	if nameEqual(n, field) {
		return nameSame
	}
	return nameOther
}

// nameEqual reports whether a and b are equal under Unicode simple case
// folding once ' ', '.', '[' and '_' are taken as one character. It does
// not allocate. Invalid UTF-8 decodes to U+FFFD, as in strings.EqualFold.
func nameEqual(a, b string) bool {
	for a != "" && b != "" {
		var ra, rb rune
		if c := a[0]; c < utf8.RuneSelf {
			ra, a = rune(c), a[1:]
		} else {
			r, size := utf8.DecodeRuneInString(a)
			ra, a = r, a[size:]
		}
		if c := b[0]; c < utf8.RuneSelf {
			rb, b = rune(c), b[1:]
		} else {
			r, size := utf8.DecodeRuneInString(b)
			rb, b = r, b[size:]
		}
		ra, rb = nameFold(ra), nameFold(rb)
		if ra == rb {
			continue
		}
		if rb < ra {
			ra, rb = rb, ra
		}
		// ASCII: only a letter and its other case are equal.
		if rb < utf8.RuneSelf {
			if 'A' <= ra && ra <= 'Z' && rb == ra+'a'-'A' {
				continue
			}
			return false
		}
		// Walk the fold orbit of the smaller rune, as strings.EqualFold does.
		r := unicode.SimpleFold(ra)
		for r != ra && r < rb {
			r = unicode.SimpleFold(r)
		}
		if r != rb {
			return false
		}
	}
	return a == b
}

// nameFold maps the characters PHP turns into '_' in field names to '_',
// and any other non-ASCII letter to the lower case of its upper case
// (textfold.Rune).
func nameFold(r rune) rune {
	switch {
	case r == ' ' || r == '.' || r == '[':
		return '_'
	case r >= utf8.RuneSelf:
		return textfold.Rune(r)
	}
	return r
}
