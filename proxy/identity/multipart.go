package identity

import (
	"bytes"
	"io"
	"mime"
	"mime/multipart"
	"strings"
)

// part is one part of a multipart/form-data body, as far as identifiers
// are concerned.
type part struct {
	name  string
	value string // the content of a field part; empty for a file
	file  bool   // the part has a filename (or filename*) parameter
	// plain reports that the part declares no Content-Transfer-Encoding
	// other than 7bit, 8bit or binary, and no charset other than UTF-8 or
	// US-ASCII: its bytes are its value for every upstream.
	plain bool
}

// errMalformedMultipart is the detail for a multipart body that does not
// parse; which of its parts would have carried the field cannot be known.
const errMalformedMultipart = "the multipart body is malformed"

// parseMultipart appends to dst the parts of a multipart/form-data body
// (already bounded by the caller). Parts with a filename are files: PHP, Rails,
// Express (busboy) and Spring all put them among uploads, not among the
// fields an application reads an address from, so their contents are not
// kept. The body is refused (an *Error) when its parts could be read
// differently by an upstream's parser:
//
//   - it does not parse (bad headers, no closing delimiter, a part cut
//     short), or a part has no single Content-Disposition, or one that does
//     not parse (Go refuses a parameter given twice);
//   - a part names itself with an RFC 2231 parameter (name*=), which Go
//     honours and PHP ignores;
//   - the delimiter "--boundary" occurs anywhere but where Go's reader
//     found the delimiters: inside a part, a bare-LF delimiter in a CRLF
//     body, "--boundaryX" or an epilogue. PHP looks for the boundary after
//     any line feed and others differ again, so a field hidden there would
//     be one framework's field and another's data.
func parseMultipart(dst []part, body []byte, boundary string) ([]part, error) {
	mr := multipart.NewReader(bytes.NewReader(body), boundary)
	parts := dst
	delimiters := 1 // the closing one
	for {
		p, err := mr.NextRawPart()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, errorf(errMalformedMultipart)
		}
		delimiters++
		cds := p.Header["Content-Disposition"]
		if len(cds) != 1 || hasExtendedName(cds[0]) {
			return nil, errorf("a part of the multipart body has no single, plain Content-Disposition")
		}
		_, params, err := mime.ParseMediaType(cds[0])
		if err != nil {
			return nil, errorf(errMalformedMultipart)
		}
		_, file := params["filename"]
		pt := part{name: params["name"], file: file, plain: plainPart(p.Header)}
		if file {
			_, err = io.Copy(io.Discard, p)
		} else {
			var b []byte
			b, err = io.ReadAll(p)
			pt.value = string(b)
		}
		if err != nil {
			return nil, errorf(errMalformedMultipart)
		}
		parts = append(parts, pt)
	}
	if bytes.Count(body, []byte("--"+boundary)) != delimiters {
		return nil, errorf("the multipart body holds its boundary outside of its delimiters")
	}
	return parts, nil
}

// multipartField finds field among the parts of a multipart body (see
// formField for present and value). The field given twice, in array
// syntax, as a file, or with a transfer encoding or charset that an
// upstream would decode first, is an *Error.
func multipartField(parts []part, field string) (value string, present bool, err error) {
	for _, p := range parts {
		switch matchName(p.name, field) {
		case nameOther:
			continue
		case nameNested:
			return "", false, errorf("field ", quote(field), " in the multipart body is given as an array or object")
		}
		switch {
		case p.file:
			return "", false, errorf("field ", quote(field), " is sent as a file in the multipart body")
		case !p.plain:
			return "", false, errorf("field ", quote(field), " in the multipart body has a Content-Transfer-Encoding or charset that sluice does not decode")
		case present:
			return "", false, errorf("field ", quote(field), " appears more than once in the multipart body (names match case-insensitively, with white space trimmed)")
		}
		present, value = true, p.value
	}
	return value, present, nil
}

// plainPart reports whether a part's bytes are its value: see part.plain.
func plainPart(h map[string][]string) bool {
	for _, cte := range h["Content-Transfer-Encoding"] {
		switch strings.ToLower(strings.TrimSpace(cte)) {
		case "7bit", "8bit", "binary":
		default:
			return false
		}
	}
	for _, ct := range h["Content-Type"] {
		_, params, err := mime.ParseMediaType(ct)
		if err != nil {
			return false
		}
		if cs, ok := params["charset"]; ok && !strings.EqualFold(cs, "utf-8") && !strings.EqualFold(cs, "us-ascii") {
			return false
		}
	}
	return true
}

// hasExtendedName reports whether a Content-Disposition value has a name
// parameter in RFC 2231 form ("name*=", "name*0="). Quoted strings are
// skipped, so a '*' inside a quoted filename does not count.
func hasExtendedName(v string) bool {
	inQuote, inKey := false, false
	start := 0
	for i := 0; i < len(v); i++ {
		c := v[i]
		switch {
		case inQuote:
			if c == '\\' {
				i++
			} else if c == '"' {
				inQuote = false
			}
		case c == '"':
			inQuote = true
		case c == ';':
			inKey, start = true, i+1
		case c == '=' && inKey:
			inKey = false
			key := strings.ToLower(strings.TrimSpace(v[start:i]))
			if strings.HasPrefix(key, "name*") {
				return true
			}
		}
	}
	return false
}
