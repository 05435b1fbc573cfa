package gateway

import (
	"bytes"
	"os"
	"reflect"
	"strings"
	"testing"
)

// TestHelpListsEverySetting: help names every command and every variable
// of the settings struct with its help text, and the settings reference
// (docs/settings.md) has one row for each variable.
func TestHelpListsEverySetting(t *testing.T) {
	ref, err := os.ReadFile("../docs/settings.md")
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := Help(&out); err != nil {
		t.Fatal(err)
	}
	help := out.String()
	for _, c := range []string{"migrate", "check-config", "version", "healthcheck", "demo-upstream", "help"} {
		if !strings.Contains(help, "\n  "+c+" ") {
			t.Errorf("help does not list the command %s", c)
		}
	}
	st := reflect.TypeFor[settings]()
	for i := range st.NumField() {
		f := st.Field(i)
		name, h := f.Tag.Get("env"), f.Tag.Get("help")
		if name == "" || h == "" {
			t.Errorf("settings.%s: needs an env and a help tag", f.Name)
			continue
		}
		if !strings.Contains(help, "\n  "+name+" ") || !strings.Contains(help, h) {
			t.Errorf("help does not list %s with its help", name)
		}
		if n := settingsRows(string(ref), name); n != 1 {
			t.Errorf("docs/settings.md has %d rows for %s, want 1", n, name)
		}
	}
}

// settingsRows counts the rows of the settings reference's tables that
// name the variable in their first column.
func settingsRows(ref, name string) int {
	n := 0
	for line := range strings.SplitSeq(ref, "\n") {
		if cells := strings.Split(line, "|"); len(cells) > 2 && strings.Contains(cells[1], "`"+name+"`") {
			n++
		}
	}
	return n
}
