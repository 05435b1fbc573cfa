package jwt

import (
	"strings"
	"testing"
)

func TestClaim(t *testing.T) {
	for _, tt := range []struct {
		json, path string
		want       string
		ok         bool
	}{
		{`{"sub":"u1"}`, "sub", "u1", true},
		{`{"sub":"  padded "}`, "sub", "  padded ", true}, // as signed: nothing is trimmed
		{`{"sub":"caf\u00e9"}`, "sub", "café", true},
		{`{"sub":""}`, "sub", "", false},
		{`{"sub":null}`, "sub", "", false},
		{`{"sub":true}`, "sub", "", false},
		{`{"sub":["u1"]}`, "sub", "", false},
		{`{"sub":{"id":"u1"}}`, "sub", "", false},
		{`{"SUB":"u1"}`, "sub", "", false}, // names are exact
		{`{}`, "sub", "", false},
		// Integers in canonical decimal, within ±(2^53−1).
		{`{"uid":1000}`, "uid", "1000", true},
		{`{"uid":0}`, "uid", "0", true},
		{`{"uid":-5}`, "uid", "-5", true},
		{`{"uid":9007199254740991}`, "uid", "9007199254740991", true},
		{`{"uid":-9007199254740991}`, "uid", "-9007199254740991", true},
		{`{"uid":9007199254740992}`, "uid", "", false},
		{`{"uid":12345678901234567890}`, "uid", "", false},
		{`{"uid":1e3}`, "uid", "", false},
		{`{"uid":1E3}`, "uid", "", false},
		{`{"uid":1000.0}`, "uid", "", false},
		{`{"uid":1000.5}`, "uid", "", false},
		{`{"uid":-0}`, "uid", "", false},
		{`{"uid":"1000"}`, "uid", "1000", true}, // a string is a string
		// Dotted paths.
		{`{"app_metadata":{"tenant_id":"t1","plan":"pro"}}`, "app_metadata.tenant_id", "t1", true},
		{`{"app_metadata":{"org":{"id":7}}}`, "app_metadata.org.id", "7", true},
		{`{"app_metadata":"t1"}`, "app_metadata.tenant_id", "", false},
		{`{"app_metadata":{"tenant_id":"t1"}}`, "app_metadata", "", false},
		{`{"app_metadata":{"tenant_id":"t1"}}`, "app_metadata.tenant", "", false},
		{`{"a":[{"b":"x"}]}`, "a.0.b", "", false}, // no indexes
		// A name with dots is read whole; both spellings at once are ambiguous.
		{`{"https://example.com/plan":"pro"}`, "https://example.com/plan", "pro", true},
		{`{"a.b":"x"}`, "a.b", "x", true},
		{`{"a":{"b":"y"}}`, "a.b", "y", true},
		{`{"a.b":"x","a":{"b":"y"}}`, "a.b", "", false},
		{`{"a.b":null,"a":{"b":"y"}}`, "a.b", "", false},
	} {
		m, ok := decodeObject([]byte(tt.json))
		if !ok {
			t.Errorf("decodeObject(%s) refused", tt.json)
			continue
		}
		got, ok := (&Claims{m: m}).Claim(tt.path)
		if got != tt.want || ok != tt.ok {
			t.Errorf("Claim(%q) of %s = %q %v, want %q %v", tt.path, tt.json, got, ok, tt.want, tt.ok)
		}
	}
	if got, ok := (*Claims)(nil).Claim("sub"); got != "" || ok {
		t.Errorf("nil Claims: %q %v", got, ok)
	}
	m, _ := decodeObject([]byte(`{"sub":"u1","uid":42,"app_metadata":{"plan":"pro"},"https://x.example/a.b":"c"}`))
	c := &Claims{m: m}
	for _, path := range []string{"sub", "uid", "app_metadata.plan", "https://x.example/a.b", "missing.path"} {
		if n := testing.AllocsPerRun(100, func() { c.Claim(path) }); n != 0 {
			t.Errorf("Claim(%q) allocates %v times", path, n)
		}
	}
}

func TestDecodeObject(t *testing.T) {
	deep := strings.Repeat(`{"a":`, maxDepth) + `1` + strings.Repeat(`}`, maxDepth)
	tooDeep := strings.Repeat(`{"a":`, maxDepth+1) + `1` + strings.Repeat(`}`, maxDepth+1)
	deepArray := `{"a":` + strings.Repeat(`[`, maxDepth) + strings.Repeat(`]`, maxDepth) + `}`
	var many, manyDup strings.Builder
	many.WriteString("{")
	for i := range 100 {
		if i > 0 {
			many.WriteString(",")
		}
		many.WriteString(`"k` + itoa(int64(i)) + `":1`)
	}
	manyDup.WriteString(many.String() + `,"K50":2}`)
	many.WriteString("}")
	for _, tt := range []struct {
		name, json string
		ok         bool
	}{
		{"empty", `{}`, true},
		{"white space", " \t\r\n{ \"a\" : [ 1 , true , null , \"x\" , { } ] } \n", true},
		{"nested", `{"a":{"b":{"c":[1,{"d":"e"}]}}}`, true},
		{"deep", deep, true},
		{"too deep", tooDeep, false},
		{"too deep in arrays", deepArray, false},
		{"many names", many.String(), true},
		{"many names, one in two cases", manyDup.String(), false},
		{"duplicate", `{"sub":"a","sub":"b"}`, false},
		{"duplicate, other values", `{"a":1,"b":2,"a":{}}`, false},
		{"case variant", `{"sub":"a","Sub":"b"}`, false},
		{"escaped duplicate", `{"sub":"a","\u0073ub":"b"}`, false},
		{"Kelvin sign", `{"kid":"a","\u212aid":"b"}`, false},
		{"long s", `{"sub":"a","\u017fub":"b"}`, false},
		{"nested duplicate", `{"a":{"b":1,"b":2}}`, false},
		{"duplicate inside an array", `{"a":[{"b":1,"B":2}]}`, false},
		{"same name in two objects", `{"a":{"b":1},"c":{"b":2}}`, true},
		{"not an object", `["a"]`, false},
		{"a string", `"a"`, false},
		{"trailing garbage", `{"a":1}x`, false},
		{"two objects", `{"a":1}{"b":2}`, false},
		{"truncated", `{"a":1`, false},
		{"trailing comma", `{"a":1,}`, false},
		{"single quotes", `{'a':1}`, false},
		{"leading zero", `{"a":01}`, false},
		{"invalid UTF-8", "{\"a\":\"\xff\"}", false},
		{"lone high surrogate", `{"a":"\ud800"}`, false},
		{"lone low surrogate", `{"a":"\udc00x"}`, false},
		{"reversed pair", `{"a":"\udc00\ud800"}`, false},
		{"surrogate pair", `{"a":"\ud83d\ude00"}`, true},
		{"escaped backslash before u", `{"a":"\\ud800"}`, true},
		{"byte order mark", "\ufeff{}", false},
		{"empty", ``, false},
	} {
		if _, ok := decodeObject([]byte(tt.json)); ok != tt.ok {
			t.Errorf("%s: decodeObject(%.60q) = %v, want %v", tt.name, tt.json, ok, tt.ok)
		}
	}
}

func TestCanonicalInteger(t *testing.T) {
	for s, want := range map[string]bool{
		"0": true, "7": true, "-7": true, "10": true, "9007199254740991": true, "-9007199254740991": true,
		"9007199254740992": false, "-0": false, "00": false, "07": false, "-07": false, "": false, "-": false,
		"1e3": false, "1.0": false, "+1": false, "1 ": false, "99999999999999999": false,
	} {
		if got := canonicalInteger(s); got != want {
			t.Errorf("canonicalInteger(%q) = %v, want %v", s, got, want)
		}
	}
}
