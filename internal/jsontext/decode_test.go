package jsontext

import (
	"encoding/json"
	"strings"
	"testing"
)

type override struct {
	Limit  int64  `json:"limit"`
	Window string `json:"window"`
	Note   any    `json:"note,omitempty"`
}

func TestDecode(t *testing.T) {
	for _, tc := range []struct {
		text, err string
	}{
		{`{"limit":3,"window":"1d"}`, ""},
		{" \r\n\t{\"limit\":3}\n ", ""},
		{`{}`, ""},
		{`{"\u006cimit":3}`, ""},
		{`{"note":{"a":1,"b":[{"a":1},{"a":2}]}}`, ""}, // a name again in another object
		{`{"note":"limit"}`, ""},

		{``, "not one JSON value: unexpected end of JSON input"},
		{`{"limit":3} x`, "not one JSON value: invalid character 'x' after top-level value"},
		{`{"limit":3}{"limit":3}`, "not one JSON value: invalid character '{' after top-level value"},
		{`{"limit":3}` + "\x00", "not one JSON value: invalid character '\\x00' after top-level value"},
		{`{"limit":3`, "not one JSON value: unexpected end of JSON input"},
		{`[{"limit":3}]`, "not a JSON object"},
		{`null`, "not a JSON object"},
		{`"limit"`, "not a JSON object"},
		{"{\"window\":\"\xff\"}", "not valid UTF-8"},
		{`{"window":"\ud800"}`, "holds an unpaired surrogate escape (not valid UTF-16)"},
		{`{"limit":1,"limit":2}`, `member "limit" given twice`},
		{`{"limit":1,"\u006cimit":2}`, `member "limit" given twice`},
		{`{"Limit":1}`, `unknown member "Limit" (names are spelled exactly as documented)`},
		{`{"LIMIT":1}`, `unknown member "LIMIT" (names are spelled exactly as documented)`},
		{`{"limit ":1}`, `unknown member "limit " (names are spelled exactly as documented)`},
		{`{"extra":1}`, `unknown member "extra" (names are spelled exactly as documented)`},
		{`{"note":{"k":1,"\u212a":2}}`, `members "k" and "\u212a" given together (names are compared ignoring case)`}, // Kelvin sign
		{`{"note":{"s":1,"\u017f":2}}`, `members "s" and "\u017f" given together (names are compared ignoring case)`}, // long s
		{`{"note":[{"a":1,"A":2}]}`, `members "a" and "A" given together (names are compared ignoring case)`},
		{`{"limit":"3"}`, "json: cannot unmarshal string into Go struct field override.limit of type int64"},
		{`{"limit":1.5}`, "json: cannot unmarshal number 1.5 into Go struct field override.limit of type int64"},
	} {
		var v override
		err := Decode([]byte(tc.text), &v)
		got := ""
		if err != nil {
			got = err.Error()
		}
		if got != tc.err {
			t.Errorf("Decode(%q) = %q, want %q", tc.text, got, tc.err)
		}
	}
	var v override
	if err := Decode([]byte(`{"limit":3,"window":"1d"}`), &v); err != nil || v.Limit != 3 || v.Window != "1d" {
		t.Errorf("decoded %+v, %v", v, err)
	}
	if err := Decode([]byte(`{}`), v); err == nil || !strings.Contains(err.Error(), "not a pointer to a struct") {
		t.Errorf("a struct, not a pointer: %v", err)
	}
}

// FuzzDecode holds Decode to encoding/json: whatever it accepts,
// json.Unmarshal reads the same way, every top-level name is one of the
// struct's exactly, and no object names a member twice under folding (a
// Token walk over it finds none).
func FuzzDecode(f *testing.F) {
	for _, s := range []string{
		`{"limit":3,"window":"1d"}`, `{"limit":1,"limit":2}`, `{"Limit":1}`, `{"note":{"k":1,"\u212a":2}}`,
		`{"note":[1,"a",{"b":null}],"window":"\u00e9"}`, `{"limit":3} x`, `[]`, `{"window":"\ud83d\ude00"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var v override
		if Decode(data, &v) != nil {
			return
		}
		var want override
		if err := json.Unmarshal(data, &want); err != nil {
			t.Fatalf("Decode accepted %q, which encoding/json refuses: %v", data, err)
		}
		if !jsonEqual(v, want) {
			t.Fatalf("Decode read %+v from %q, encoding/json %+v", v, data, want)
		}
		var top map[string]json.RawMessage
		if err := json.Unmarshal(data, &top); err != nil {
			t.Fatal(err)
		}
		for name := range top {
			if name != "limit" && name != "window" && name != "note" {
				t.Fatalf("Decode accepted the member %q of %q", name, data)
			}
		}
		dec := json.NewDecoder(strings.NewReader(string(data)))
		var stack []map[string]bool // the folded names of each open object
		var inObject []bool         // whether each open value is an object
		expectName := false
		for {
			tok, err := dec.Token()
			if err != nil {
				break
			}
			switch tok := tok.(type) {
			case json.Delim:
				switch tok {
				case '{':
					stack = append(stack, map[string]bool{})
					inObject = append(inObject, true)
					expectName = true
					continue
				case '[':
					inObject = append(inObject, false)
				case '}':
					stack = stack[:len(stack)-1]
					inObject = inObject[:len(inObject)-1]
				case ']':
					inObject = inObject[:len(inObject)-1]
				}
			case string:
				if expectName {
					f := FoldName(tok)
					if stack[len(stack)-1][f] {
						t.Fatalf("Decode accepted %q, which names %q twice", data, tok)
					}
					stack[len(stack)-1][f] = true
					expectName = false
					continue
				}
			}
			expectName = len(inObject) > 0 && inObject[len(inObject)-1]
		}
	})
}

func jsonEqual(a, b override) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return string(x) == string(y)
}
