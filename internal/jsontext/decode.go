package jsontext

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Decode decodes data, a request body, into v, a pointer to a struct,
// refusing whatever two JSON readers could read differently:
//
//   - data is exactly one JSON value (RFC 8259), an object, with nothing
//     around it but white space, in valid UTF-8, with no unpaired
//     surrogate escape ("\ud800", see LoneSurrogate);
//   - no object, at any depth, names a member twice, also when the two
//     names differ only under Unicode simple case folding ("limit" and
//     "Limit", "sk" and "ſK"): readers keep the first, the last, or match
//     names case-insensitively, as encoding/json does;
//   - every member of the top-level object names a field of v exactly
//     as written (its json tag's name, else the Go field's name): no
//     unknown member, and no other spelling that encoding/json would
//     fold onto a field.
//
// Names are compared once unescaped ("\u006cimit" is "limit"). A member
// of v that data leaves out keeps its value. The error says which rule
// data broke, in words fit for a client.
func Decode(data []byte, v any) error {
	names, err := fieldNames(v)
	if err != nil {
		return err
	}
	switch {
	case !utf8.Valid(data):
		return errors.New("not valid UTF-8")
	case !json.Valid(data):
		var x any
		if err := json.Unmarshal(data, &x); err != nil {
			return fmt.Errorf("not one JSON value: %w", err)
		}
		return errors.New("not one JSON value")
	case LoneSurrogate(data):
		return errors.New("holds an unpaired surrogate escape (not valid UTF-16)")
	}
	w := strictWalker{Walker{B: data}}
	if w.Next() != '{' {
		return errors.New("not a JSON object")
	}
	if err := w.object(names); err != nil {
		return err
	}
	if w.Next() != 0 { // json.Valid rules it out; a walker bug must not pass
		return errors.New("not one JSON value")
	}
	return json.Unmarshal(data, v)
}

// fieldNames are the member names that encoding/json decodes into the
// struct v points to.
func fieldNames(v any) (map[string]bool, error) {
	t := reflect.TypeOf(v)
	if t == nil || t.Kind() != reflect.Pointer || t.Elem().Kind() != reflect.Struct {
		return nil, fmt.Errorf("jsontext.Decode: %T is not a pointer to a struct", v)
	}
	names := map[string]bool{}
	for f := range t.Elem().Fields() {
		if !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch name {
		case "-":
			continue
		case "":
			name = f.Name
		}
		names[name] = true
	}
	return names, nil
}

// strictWalker checks the members of text that json.Valid accepted.
type strictWalker struct{ Walker }

// object checks the object whose '{' is at I: its names are distinct
// under folding and, when top is not nil, each one of top; its values are
// checked in turn.
func (w *strictWalker) object(top map[string]bool) error {
	seen := map[string]string{} // folded name → name as given
	return w.members('}', func() error {
		if w.Next() != '"' {
			return errors.New("not one JSON value")
		}
		name, err := w.str()
		if err != nil {
			return err
		}
		if top != nil && !top[name] {
			return fmt.Errorf("unknown member %+q (names are spelled exactly as documented)", name)
		}
		f := FoldName(name)
		if first, dup := seen[f]; dup {
			if first == name {
				return fmt.Errorf("member %+q given twice", name)
			}
			return fmt.Errorf("members %+q and %+q given together (names are compared ignoring case)", first, name)
		}
		seen[f] = name
		if w.Next() != ':' {
			return errors.New("not one JSON value")
		}
		w.I++
		return w.value()
	})
}

// members checks the members of the object, or the elements of the
// array, whose opening byte is at I: each in turn with member, up to the
// end byte that closes it ('}' or ']').
func (w *strictWalker) members(end byte, member func() error) error {
	w.I++
	if w.Next() == end {
		w.I++
		return nil
	}
	for {
		if err := member(); err != nil {
			return err
		}
		switch w.Next() {
		case ',':
			w.I++
		case end:
			w.I++
			return nil
		default:
			return errors.New("not one JSON value")
		}
	}
}

// value checks the value at I: an object's or array's members, and
// steps over anything else.
func (w *strictWalker) value() error {
	switch w.Next() {
	case '{':
		return w.object(nil)
	case '[':
		return w.members(']', w.value)
	case '"':
		_, err := w.str()
		return err
	case 0:
		return errors.New("not one JSON value")
	}
	start := w.I // a number or a literal
	for w.I < len(w.B) && strings.IndexByte(",}]: \t\r\n", w.B[w.I]) < 0 {
		w.I++
	}
	if w.I == start {
		return errors.New("not one JSON value")
	}
	return nil
}

// str reads the string at I, unescaped as encoding/json unescapes it.
func (w *strictWalker) str() (string, error) {
	raw, escaped, ok := w.String()
	switch {
	case !ok:
		return "", errors.New("not one JSON value")
	case !escaped:
		return string(raw[1 : len(raw)-1]), nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", errors.New("not one JSON value")
	}
	return s, nil
}

// FoldName returns a form of name that two names share exactly when they
// are equal under Unicode simple case folding (as strings.EqualFold
// compares them): each rune replaced by the least rune of its folding
// orbit. It does not allocate for an ASCII name without lower-case
// letters.
func FoldName(name string) string {
	plain := true
	for i := 0; i < len(name); i++ {
		if c := name[i]; c >= utf8.RuneSelf || 'a' <= c && c <= 'z' {
			plain = false
			break
		}
	}
	if plain {
		return name
	}
	var b strings.Builder
	b.Grow(len(name))
	for _, r := range name {
		least := r
		for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
			least = min(least, f)
		}
		b.WriteRune(least)
	}
	return b.String()
}
