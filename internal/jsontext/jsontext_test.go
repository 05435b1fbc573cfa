package jsontext

import (
	"encoding/json"
	"testing"
)

func TestLoneSurrogate(t *testing.T) {
	for _, tc := range []struct {
		text string
		lone bool
	}{
		{`{"a":"plain"}`, false},
		{`{"a":"\u00e9\n\\u0041"}`, false},
		{`{"a":"\ud83d\ude00"}`, false}, // a pair
		{`{"a":"\uD83D\uDE00"}`, false},
		{`{"a":"\ud800"}`, true},
		{`{"a":"\udc00"}`, true},        // a low surrogate first
		{`{"a":"\udc00\ud800"}`, true},  // the wrong order
		{`{"a":"\ud800\u0041"}`, true},  // high, then no low
		{`{"a":"\ud800x\udc00"}`, true}, // not at once
		{`{"\ud800":"key"}`, true},      // in a name too
		{`{"a":"\\ud800"}`, false},      // an escaped backslash, then text
		{`{"a":"\\\ud800"}`, true},      // an escaped backslash, then a lone one
	} {
		if !json.Valid([]byte(tc.text)) {
			t.Fatalf("%s: not valid JSON", tc.text)
		}
		if got := LoneSurrogate([]byte(tc.text)); got != tc.lone {
			t.Errorf("LoneSurrogate(%s) = %v, want %v", tc.text, got, tc.lone)
		}
	}
}

func TestWalker(t *testing.T) {
	w := Walker{B: []byte(" \t\r\n\"a\\\"b\" : \"c\"")}
	if c := w.Next(); c != '"' || w.I != 4 {
		t.Fatalf("Next = %q at %d", c, w.I)
	}
	raw, escaped, ok := w.String()
	if string(raw) != `"a\"b"` || !escaped || !ok {
		t.Fatalf("String = %s %v %v", raw, escaped, ok)
	}
	if c := w.Next(); c != ':' {
		t.Fatalf("Next = %q", c)
	}
	w.I++
	w.Next()
	if raw, escaped, ok := w.String(); string(raw) != `"c"` || escaped || !ok {
		t.Fatalf("String = %s %v %v", raw, escaped, ok)
	}
	if c := w.Next(); c != 0 {
		t.Fatalf("Next at the end = %q", c)
	}
	w = Walker{B: []byte(`"unterminated\"`)}
	if _, _, ok := w.String(); ok {
		t.Fatal("an unterminated string was read")
	}
}
