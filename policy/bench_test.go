package policy

import (
	"fmt"
	"strings"
	"testing"
)

func BenchmarkMatch(b *testing.B) {
	var src strings.Builder
	src.WriteString(specExample)
	for i := range 20 { // a larger policy than most
		fmt.Fprintf(&src, "r%d: GET,POST /svc%d/* by ip 10/1m\n", i, i)
	}
	p := mustParse(b, src.String())
	for _, path := range []string{"/api/login", "/svc19/items/1", "/static/app.js"} {
		b.Run(path, func(b *testing.B) {
			dst := make([]*Rule, 0, p.Len())
			b.ReportAllocs()
			for b.Loop() {
				dst = p.Match("POST", path, dst[:0])
			}
		})
	}
}

func BenchmarkCanonicalPath(b *testing.B) {
	for _, bc := range []struct{ name, path string }{
		{"canonical", "/api/v1/users/42/orders"},
		{"messy", "/API//v1/./users/%34%32/x/../orders/"},
		{"long", "/" + strings.Repeat("segment/", 40)},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := CanonicalPath(bc.path); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkMatchPath(b *testing.B) {
	for _, bc := range []struct{ name, path string }{
		{"match form", "/api/v1/users/42/orders"},
		{"upper case", "/API/v1/Users/42/Orders/"},
		{"encoded", "/api%2Fv1/users;v=2/%2542/orders"},
		{"unicode", "/api/v1/us%C4%B1ers/42/%EF%BD%8Frders"},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_ = MatchPath(bc.path)
			}
		})
	}
}

func BenchmarkParse(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Parse(specExample); err != nil {
			b.Fatal(err)
		}
	}
}
