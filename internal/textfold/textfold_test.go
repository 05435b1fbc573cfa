package textfold

import (
	"testing"

	"golang.org/x/text/unicode/norm"
)

func TestLowerUpper(t *testing.T) {
	for in, want := range map[string]string{
		"LOGIN":  "login",
		"logın":  "login", // dotless ı upper-cases to I
		"ſecret": "secret",
		"\u212a": "k", // Kelvin sign
		"İ":      "i", // I with a dot above: the dot goes
		"ΣΑΣ":    "σασ",
	} {
		if got := norm.NFC.String(LowerUpper(norm.NFD.String(in))); got != want {
			t.Errorf("LowerUpper(%q) = %q, want %q", in, got, want)
		}
	}
}
