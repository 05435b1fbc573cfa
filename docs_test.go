package main

// Tests that keep the documentation true: README.md and the pages of
// docs/ link only to files and headings that exist, every rule example in
// them parses as `sluice check-config` parses rules, and every setting
// they name is one that sluice reads, and the other way round.

import (
	"bytes"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode"

	"github.com/sluicehq/sluice/gateway"
)

// docFiles are the documents these tests keep true: the README and every
// page of docs/.
func docFiles(t *testing.T) []string {
	t.Helper()
	pages, err := filepath.Glob("docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	return append([]string{"README.md"}, pages...)
}

// mdBlock is a fenced code block of a Markdown document.
type mdBlock struct {
	info   string // the info string after the opening fence: "rules", "sh", ""
	text   string
	line   int    // of the opening fence, from 1
	before string // the last non-blank line before the fence
}

// mdDoc is a Markdown document split into its prose (code blocks
// blanked, line numbers kept) and its fenced code blocks.
type mdDoc struct {
	path   string
	prose  []string
	blocks []mdBlock
}

func readDoc(t *testing.T, path string) mdDoc {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	d := mdDoc{path: path}
	var (
		in     *mdBlock
		fence  string
		body   []string
		before string
	)
	for i, line := range strings.Split(string(b), "\n") {
		trimmed := strings.TrimLeft(line, " ")
		switch {
		case in == nil && (strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~")):
			fence = trimmed[:3]
			in = &mdBlock{info: strings.TrimSpace(strings.TrimLeft(trimmed, "`~")), line: i + 1, before: before}
			body = nil
			d.prose = append(d.prose, "")
		case in != nil && strings.HasPrefix(trimmed, fence) && strings.Trim(trimmed, fence[:1]) == "":
			in.text = strings.Join(body, "\n")
			d.blocks = append(d.blocks, *in)
			in = nil
			d.prose = append(d.prose, "")
		case in != nil:
			body = append(body, line)
			d.prose = append(d.prose, "")
		default:
			d.prose = append(d.prose, line)
			if strings.TrimSpace(line) != "" {
				before = strings.TrimSpace(line)
			}
		}
	}
	if in != nil {
		t.Errorf("%s:%d: a code block that never closes", path, in.line)
	}
	return d
}

var (
	headingLine = regexp.MustCompile(`^(#{1,6})\s+(.+?)\s*#*\s*$`)
	inlineCode  = regexp.MustCompile("`+[^`]*`+")
	mdLink      = regexp.MustCompile(`\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)
	htmlLink    = regexp.MustCompile(`(?:href|src)="([^"]+)"`)
)

// slug is GitHub's anchor for a heading: the text as displayed, lower
// case, every character but letters, digits, spaces, '-' and '_' dropped,
// spaces turned into '-'.
func slug(heading string) string {
	heading = mdLink.ReplaceAllString(heading, "]") // [text](url): the text
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.Is(unicode.Mn, r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// anchors are the anchors of a document's headings, as GitHub makes them:
// the second heading of one slug gets "-1", the third "-2".
func (d mdDoc) anchors() map[string]bool {
	seen := map[string]int{}
	out := map[string]bool{}
	for _, line := range d.prose {
		m := headingLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		s := slug(m[2])
		if n := seen[s]; n > 0 {
			out[s+"-"+strconv.Itoa(n)] = true
		} else {
			out[s] = true
		}
		seen[s]++
	}
	return out
}

// links are the targets of a document's Markdown and HTML links outside
// code, with the line each is on.
func (d mdDoc) links() (targets []string, lines []int) {
	for i, line := range d.prose {
		line = inlineCode.ReplaceAllString(line, "")
		for _, re := range []*regexp.Regexp{mdLink, htmlLink} {
			for _, m := range re.FindAllStringSubmatch(line, -1) {
				targets = append(targets, m[1])
				lines = append(lines, i+1)
			}
		}
	}
	return targets, lines
}

// TestDocsLinks: every relative link of README.md and docs/*.md names a
// file of the repository, and every #anchor a heading of its document.
func TestDocsLinks(t *testing.T) {
	docs := map[string]mdDoc{}
	load := func(path string) (mdDoc, bool) {
		if d, ok := docs[path]; ok {
			return d, true
		}
		if _, err := os.Stat(path); err != nil {
			return mdDoc{}, false
		}
		docs[path] = readDoc(t, path)
		return docs[path], true
	}
	count := 0
	for _, path := range docFiles(t) {
		d, _ := load(path)
		targets, lines := d.links()
		for i, target := range targets {
			if regexp.MustCompile(`^[a-z][a-z0-9+.-]*:`).MatchString(target) {
				continue // https:, mailto:: not this test's business
			}
			count++
			file, anchor, _ := strings.Cut(target, "#")
			where := fmt.Sprintf("%s:%d: link %q", path, lines[i], target)
			to := path
			if file != "" {
				to = filepath.Join(filepath.Dir(path), file)
				if _, err := os.Stat(to); err != nil {
					t.Errorf("%s: no file %s", where, to)
					continue
				}
			}
			if anchor == "" {
				continue
			}
			if !strings.HasSuffix(to, ".md") {
				t.Errorf("%s: an anchor in a file that is not Markdown", where)
				continue
			}
			target, _ := load(to)
			if !target.anchors()[anchor] {
				t.Errorf("%s: %s has no heading with the anchor #%s", where, to, anchor)
			}
		}
	}
	if count < 50 {
		t.Errorf("checked %d relative links: the documents have more, so the reader of links is broken", count)
	}
}

// TestDocsMapReachesEveryPage: every page of docs/ is linked from the
// README, so that a reader who starts there finds all of them.
func TestDocsMapReachesEveryPage(t *testing.T) {
	readme := readDoc(t, "README.md")
	targets, _ := readme.links()
	linked := map[string]bool{}
	for _, target := range targets {
		file, _, _ := strings.Cut(target, "#")
		linked[filepath.Clean(file)] = true
	}
	for _, page := range docFiles(t)[1:] {
		if !linked[page] {
			t.Errorf("README.md does not link %s", page)
		}
	}
}

// invalidRules marks a rules block that shows a mistake: it must be the
// last line before the block, and the block must not parse, with an
// error that holds the text after the colon.
const invalidRules = "<!-- invalid rules:"

// looksLikeRule is a line of the rule language: "name: METHODS path by".
var looksLikeRule = regexp.MustCompile(`^[a-z0-9-]+:\s+(\*|[A-Z]+(,[A-Z]+)*)\s+\S+\s+by\s`)

// inlineRules are rules given to sluice in a shell line of the docs.
var inlineRules = regexp.MustCompile(`SLUICE_RULES='([^']*)'`)

// checkRules parses rules as `sluice check-config` does, with keys to
// verify tokens so that jwt rules and plans are accepted.
func checkRules(rules string) error {
	return gateway.CheckConfig(map[string]string{
		"SLUICE_UPSTREAM":    "http://127.0.0.1:3000",
		"SLUICE_RLS_LISTEN":  "127.0.0.1:8081",
		"SLUICE_JWT_SECRET":  strings.Repeat("k", 64),
		"SLUICE_RULES":       rules,
		"SLUICE_ADMIN_TOKEN": "",
	}, new(bytes.Buffer))
}

// TestDocsRuleExamples: every rule example of the docs parses through
// check-config, each block as one set of rules: the ```rules blocks, and
// the SLUICE_RULES='…' of shell lines. A block whose lines look like rules
// must say it is one (```rules), so that none escapes the test, and one
// that shows a mistake says so (invalidRules) and must fail as it says.
func TestDocsRuleExamples(t *testing.T) {
	n := 0
	for _, path := range docFiles(t) {
		d := readDoc(t, path)
		for _, b := range d.blocks {
			where := fmt.Sprintf("%s:%d", path, b.line)
			if b.info != "rules" {
				for _, m := range inlineRules.FindAllStringSubmatch(b.text, -1) {
					n++
					if err := checkRules(m[1]); err != nil {
						t.Errorf("%s: SLUICE_RULES='%s' does not pass check-config:\n%v", where, m[1], err)
					}
				}
				for line := range strings.Lines(b.text) {
					if looksLikeRule.MatchString(line) {
						t.Errorf("%s: a ```%s block holds a rule (%q): make it a ```rules block, which this test parses", where, b.info, strings.TrimSpace(line))
						break
					}
				}
				continue
			}
			n++
			err := checkRules(b.text)
			if want, ok := strings.CutPrefix(b.before, invalidRules); ok {
				want = strings.TrimSpace(strings.TrimSuffix(want, "-->"))
				switch {
				case err == nil:
					t.Errorf("%s: the rules marked invalid pass check-config", where)
				case !strings.Contains(err.Error(), want):
					t.Errorf("%s: the rules marked invalid fail with %q, not %q", where, err, want)
				}
				continue
			}
			if err != nil {
				t.Errorf("%s: the rules do not pass check-config:\n%v", where, err)
			}
		}
	}
	if n < 15 {
		t.Errorf("parsed %d rule examples: the documents have more, so the reader of blocks is broken", n)
	}
}

// testSettings are variables the docs name that are not settings of
// sluice but of its tests, each with the file that reads it.
var testSettings = map[string]string{
	"SLUICE_TEST_DATABASE_URL": ".ci/postgres.sh",
	"SLUICE_TEST_BINARY":       "internal/proctest/build.go",
	"SLUICE_SCREENSHOT_DIR":    "gateway/console_test.go",
}

// settingName is a variable of sluice's, or the start of a family of them
// (SLUICE_JWT_*).
var settingName = regexp.MustCompile(`SLUICE_[A-Z0-9_]*[A-Z0-9](_\*)?`)

// configSettings are the variables gateway/config.go reads: every env tag
// of its structs.
func configSettings(t *testing.T) map[string]bool {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "gateway/config.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	ast.Inspect(f, func(n ast.Node) bool {
		if field, ok := n.(*ast.Field); ok && field.Tag != nil {
			tag, _ := strconv.Unquote(field.Tag.Value)
			if env := reflect.StructTag(tag).Get("env"); env != "" {
				out[env] = true
			}
		}
		return true
	})
	if len(out) < 40 {
		t.Fatalf("found %d settings in gateway/config.go: the reader of its tags is broken", len(out))
	}
	return out
}

// TestDocsSettings: every SLUICE_ variable the docs name is a setting of
// gateway/config.go (or of the tests, testSettings), and every setting of
// config.go has its row in the settings reference, docs/settings.md.
func TestDocsSettings(t *testing.T) {
	settings := configSettings(t)
	for name, file := range testSettings {
		b, err := os.ReadFile(file)
		if err != nil || !bytes.Contains(b, []byte(name)) {
			t.Errorf("%s: testSettings says %s reads it, and it does not", name, file)
		}
	}
	for _, path := range docFiles(t) {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(b), "\n") {
			for _, name := range settingName.FindAllString(line, -1) {
				if prefix, ok := strings.CutSuffix(name, "*"); ok {
					if !slices.ContainsFunc(slices.Collect(maps.Keys(settings)), func(s string) bool { return strings.HasPrefix(s, prefix) }) {
						t.Errorf("%s:%d: %s names no setting of gateway/config.go", path, i+1, name)
					}
					continue
				}
				if !settings[name] && testSettings[name] == "" {
					t.Errorf("%s:%d: %s is no setting of gateway/config.go", path, i+1, name)
				}
			}
		}
	}
	ref, err := os.ReadFile("docs/settings.md")
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]int{}
	for line := range strings.Lines(string(ref)) {
		if cells := strings.Split(line, "|"); len(cells) > 2 {
			for _, m := range regexp.MustCompile("`([A-Z_]+)`").FindAllStringSubmatch(cells[1], -1) {
				rows[m[1]]++
			}
		}
	}
	for name := range settings {
		if rows[name] != 1 {
			t.Errorf("docs/settings.md has %d rows for %s, a setting of gateway/config.go; want 1", rows[name], name)
		}
	}
	for name := range rows {
		if !settings[name] {
			t.Errorf("docs/settings.md has a row for %s, which gateway/config.go does not read", name)
		}
	}
}

// TestQuickstartBlocks: the README's Quickstart has the two shell blocks
// TestQuickstart runs (which needs Postgres tools and free ports, and is
// skipped with -short), the gateway on memory then on Postgres, so that
// a change that would leave TestQuickstart nothing to run fails here too.
func TestQuickstartBlocks(t *testing.T) {
	blocks := quickstartBlocks(t)
	for i, want := range [][]string{
		{"go build -o sluice .", "./sluice demo-upstream &", "SLUICE_RULES=", "127.0.0.1:8080/hello"},
		{"./sluice migrate", "SLUICE_DATABASE_URL", "127.0.0.1:8081/hello", "kill %1 %2 %3"},
	} {
		for _, w := range want {
			if !strings.Contains(blocks[i], w) {
				t.Errorf("Quickstart block %d has no %q:\n%s", i+1, w, blocks[i])
			}
		}
	}
}
