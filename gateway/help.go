package gateway

import (
	"fmt"
	"io"
	"reflect"
	"strings"
	"text/tabwriter"
)

// commands are sluice's commands as --help lists them, in that order;
// main.go dispatches each to its function here (Serve, Migrate, …).
var commands = []struct{ name, help string }{
	{"(none)", "run the gateway"},
	{"migrate", "apply the database migrations to SLUICE_DB_SCHEMA and exit (reads only SLUICE_DATABASE_URL and SLUICE_DB_SCHEMA)"},
	{"check-config", "validate the settings and the rules, print the rules, exit 0 or 1"},
	{"version", "print the version, the commit and the Go version (also --version)"},
	{"healthcheck", "GET /healthz on SLUICE_ADMIN_LISTEN, exit 0 if it answers 200, else 1"},
	{"demo-upstream [host:port]", "serve a tiny demo API (default " + demoUpstreamAddr + ") for the quickstart: every request gets 200 and a line naming it"},
	{"help", "print this help (also --help, -h)"},
}

// Help is `sluice help` (also --help and -h): it prints the commands and
// every setting with its default. The settings come from the env,
// envDefault and help tags of settings, so the list cannot leave one out.
func Help(w io.Writer) error {
	var b strings.Builder
	b.WriteString("usage: sluice [command]\n\ncommands:\n")
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	for _, c := range commands {
		fmt.Fprintf(tw, "  %s\t%s\n", c.name, c.help)
	}
	tw.Flush()
	b.WriteString("\nsettings (environment variables, with their defaults):\n")
	tw = tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	for _, s := range settingsHelp() {
		def := s.def
		if def == "" {
			def = "-"
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\n", s.name, def, s.help)
	}
	tw.Flush()
	b.WriteString("\nSIGHUP reloads SLUICE_RULES_FILE, SLUICE_JWT_JWKS_FILE and the SLUICE_TLS_* files; SIGINT and SIGTERM drain in-flight requests and exit.\nThe README and docs/ have the details: docs/rules.md (the rule language), docs/settings.md, docs/admin.md (the admin API).\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// settingHelp is one setting as --help shows it.
type settingHelp struct{ name, def, help string }

// settingsHelp lists the settings in the order of the settings struct.
func settingsHelp() []settingHelp {
	t := reflect.TypeFor[settings]()
	out := make([]settingHelp, 0, t.NumField())
	for i := range t.NumField() {
		f := t.Field(i)
		out = append(out, settingHelp{name: f.Tag.Get("env"), def: f.Tag.Get("envDefault"), help: f.Tag.Get("help")})
	}
	return out
}
