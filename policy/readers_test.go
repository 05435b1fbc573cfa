package policy

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/sluicehq/sluice/internal/proctest"
)

// pathReaderRows are spellings of a path, each with what sluice makes of it
// under a rule for that path: "match" (counted under the rule), "400"
// (refused: sluice cannot tell what the upstream reads) or "other" (another
// path). TestPathReaders asks every reader it can run whether it takes the
// spelling for the rule's path; whenever one does, sluice must match or
// refuse it. The next spelling someone finds is one more row.
var pathReaderRows = []struct {
	rule, spelling, want string
}{
	{"/api/login", "/api/login", "match"},
	{"/api/login", "/API/Login", "match"},
	{"/api/login", "/api//login", "match"},
	{"/api/login", "/api/./login", "match"},
	{"/api/login", "/api/x/../login", "match"},
	{"/api/login", "/api/%6Cogin", "match"},
	{"/api/login", "/api/log%C4%B1n", "match"},                                // dotless ı
	{"/api/login", "/api/LOG%C4%B0N", "match"},                                // İ
	{"/api/login", "/api/logi%CC%87n", "match"},                               // i and a dot above
	{"/api/secret", "/api/%C5%BFecret", "match"},                              // long ſ
	{"/api/keys", "/api/%E2%84%AAeys", "match"},                               // Kelvin sign
	{"/admin/x", "/adm%C4%B1n/x", "match"},                                    //
	{"/admin/x", "/%EF%BD%81%EF%BD%84%EF%BD%8D%EF%BD%89%EF%BD%8E/x", "match"}, // fullwidth
	{"/admin/x", "/%EF%BC%A1DMIN/x", "match"},                                 //
	{"/admin/x", "/admin%EF%BC%8Fx", "match"},                                 // fullwidth solidus
	{"/strasse", "/stra%C3%9Fe", "match"},                                     // ß
	{"/strasse", "/STRA%E1%BA%9EE", "match"},                                  // ẞ
	{"/file", "/%EF%AC%81le", "match"},                                        // ﬁ
	{"/office", "/o%EF%AC%83ce", "match"},                                     // ﬃ
	{"/api/σσ", "/api/%CF%82%CE%A3", "match"},                                 // final sigma
	{"/api/login", "/api/login%C2%A0", "match"},                               // trailing White_Space
	{"/api/login", "/api/login%E3%80%80", "match"},                            //
	{"/api/login", "/api/login::$DATA", "match"},                              // NTFS streams: Windows only
	{"/admin/x", "/admin::$INDEX_ALLOCATION/x", "match"},
	{"/api/secret", "/api/x%23/../secret", "match"},
	{"/api/login", "/api/logim", "other"},
	{"/api/login", "/api/log%C3%ADn", "other"}, // í is another letter to every reader
	{"/api/login", "/api/login2", "other"},
	{"/api/secret", "/api/x%EF%BC%8F..%EF%BC%8Fsecret", "400"},
	{"/api/secret", "/api/x/%EF%BC%8E%EF%BC%8E/secret", "400"},
	{"/api/secret", "/api/x/%E2%80%A5/secret", "400"},
	{"/api/secret", "/api/x/%2e%2e/secret", "400"},
}

// sluiceReads returns what sluice makes of an escaped path under the exact
// rule for rulePath: "match", "400" or "other".
func sluiceReads(t *testing.T, rulePath, escaped string) string {
	t.Helper()
	rc, err := CanonicalPath(rulePath)
	if err != nil {
		t.Fatalf("rule path %q: %v", rulePath, err)
	}
	rule := &Rule{Path: MatchPath(rc)}
	c, err := CanonicalPath(escaped)
	switch {
	case err != nil:
		return "400"
	case rule.matchesPath(MatchPath(c)):
		return "match"
	}
	return "other"
}

// escapeAll percent-encodes every byte of s that is not unreserved or "/",
// as a client would send a decoded path.
func escapeAll(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if c := s[i]; c == '/' || isUnreserved(c) {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}

// readerTool is proctest.Tool: the path of the program name, from the
// Debian package pkg; the test is skipped without it, or failed when CI
// is set (.ci/run installs it), as deploy's tools are.
func readerTool(t *testing.T, name, pkg string) string {
	t.Helper()
	return proctest.Tool(t, name, pkg)
}

// readerVerdicts is what one run of a reader program says: the rows each
// of its readers takes for the rule's path, and the code points each takes
// for an ASCII text.
type readerVerdicts struct {
	rows  map[string][]int // reader: row indexes
	chars map[string]map[rune]string
}

// runReaders feeds the rows, decoded, to a reader program (see
// testdata/readers/Readers.java for the protocol) and parses its answer.
func runReaders(t *testing.T, cmd *exec.Cmd) readerVerdicts {
	t.Helper()
	var in bytes.Buffer
	for _, r := range pathReaderRows {
		s, err := url.PathUnescape(r.spelling)
		if err != nil {
			t.Fatalf("row %q: %v", r.spelling, err)
		}
		fmt.Fprintf(&in, "%s\t%s\n", r.rule, s)
	}
	cmd.Stdin = &in
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s: %v\n%s", cmd, err, stderr.Bytes())
	}
	v := readerVerdicts{rows: map[string][]int{}, chars: map[string]map[rune]string{}}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Split(sc.Text(), "\t")
		switch {
		case len(f) == 3 && f[0] == "row":
			i, err := strconv.Atoi(f[1])
			if err != nil {
				t.Fatalf("%s: %q", cmd, sc.Text())
			}
			v.rows[f[2]] = append(v.rows[f[2]], i)
		case len(f) == 4 && f[0] == "char":
			cp, err := strconv.ParseUint(f[2], 16, 32)
			if err != nil {
				t.Fatalf("%s: %q", cmd, sc.Text())
			}
			if v.chars[f[1]] == nil {
				v.chars[f[1]] = map[rune]string{}
			}
			v.chars[f[1]][rune(cp)] = f[3]
		case sc.Text() == "":
		default:
			t.Fatalf("%s: unexpected line %q", cmd, sc.Text())
		}
	}
	return v
}

// checkVerdicts fails t for every row or code point that a reader takes
// for the rule's path (or for an ASCII text) and sluice does not.
func checkVerdicts(t *testing.T, v readerVerdicts) {
	t.Helper()
	for reader, rows := range v.rows {
		t.Logf("%s reads %d of %d rows as the rule's path", reader, len(rows), len(pathReaderRows))
		for _, i := range rows {
			r := pathReaderRows[i]
			if got := sluiceReads(t, r.rule, r.spelling); got == "other" {
				t.Errorf("%s reads %q as %q; sluice reads it as another path", reader, r.spelling, r.rule)
			}
		}
	}
	for reader, chars := range v.chars {
		n := 0
		for cp, ascii := range chars {
			if !sameChar(t, cp, ascii) {
				if n++; n <= 20 {
					t.Errorf("%s reads U+%04X %q as %q; sluice does not", reader, cp, string(cp), ascii)
				}
			}
		}
		if n > 20 {
			t.Errorf("%s: %d more code points", reader, n-20)
		}
		t.Logf("%s: %d code points read as ASCII text, %d of them matched by sluice", reader, len(chars), len(chars)-n)
	}
}

// sameChar reports whether sluice matches a path holding the code point cp
// as the path holding the ASCII text instead, or refuses it.
func sameChar(t *testing.T, cp rune, ascii string) bool {
	wide := escapeAll("/a" + string(cp) + "b")
	c, err := CanonicalPath(wide)
	if err != nil {
		return true // refused
	}
	narrow, err := CanonicalPath(escapeAll("/a" + ascii + "b"))
	if err != nil {
		t.Fatalf("CanonicalPath of %q: %v", ascii, err)
	}
	return MatchPath(c) == MatchPath(narrow)
}

// TestPathReaders checks sluice's path matching against the readers that
// upstreams compare paths with: each spelling of pathReaderRows that some
// reader takes for the rule's path, and each code point a reader takes for
// ASCII text (the whole of Unicode, one code point at a time), must be
// matched as that path or refused. Go's readers run in the test; Java,
// JavaScript (Node.js), Python and nginx as programs, skipped when missing
// unless CI is set.
func TestPathReaders(t *testing.T) {
	for _, r := range pathReaderRows {
		if got := sluiceReads(t, r.rule, r.spelling); got != r.want {
			t.Errorf("sluice reads %q under rule %q as %s, want %s", r.spelling, r.rule, got, r.want)
		}
	}
	t.Run("go strings.EqualFold", func(t *testing.T) {
		v := readerVerdicts{rows: map[string][]int{}, chars: map[string]map[rune]string{"go strings.EqualFold": {}}}
		for i, r := range pathReaderRows {
			if s, _ := url.PathUnescape(r.spelling); strings.EqualFold(s, r.rule) {
				v.rows["go strings.EqualFold"] = append(v.rows["go strings.EqualFold"], i)
			}
		}
		// EqualFold compares code points by their simple folding orbits.
		for cp := rune(0x80); cp <= unicode.MaxRune; cp++ {
			for f := unicode.SimpleFold(cp); f != cp; f = unicode.SimpleFold(f) {
				if f < utf8.RuneSelf {
					v.chars["go strings.EqualFold"][cp] = string(f)
				}
			}
		}
		checkVerdicts(t, v)
	})
	t.Run("go net/http.ServeMux", func(t *testing.T) {
		v := readerVerdicts{rows: map[string][]int{}}
		for i, r := range pathReaderRows {
			mux := http.NewServeMux()
			mux.HandleFunc(r.rule, func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(299) })
			target := r.spelling
			for range 2 { // a cleaned path is a redirect, followed once
				req, err := http.ReadRequest(bufio.NewReader(strings.NewReader("GET " + target + " HTTP/1.1\r\nHost: x\r\n\r\n")))
				if err != nil {
					break
				}
				w := httptest.NewRecorder()
				mux.ServeHTTP(w, req)
				if w.Code == 299 {
					v.rows["go net/http.ServeMux"] = append(v.rows["go net/http.ServeMux"], i)
				}
				if target = w.Header().Get("Location"); w.Code/100 != 3 || target == "" {
					break
				}
			}
		}
		checkVerdicts(t, v)
	})
	t.Run("java", func(t *testing.T) {
		java := readerTool(t, "java", "default-jdk-headless")
		checkVerdicts(t, runReaders(t, exec.Command(java, filepath.Join("testdata", "readers", "Readers.java"))))
	})
	t.Run("javascript", func(t *testing.T) {
		node := readerTool(t, "node", "nodejs")
		checkVerdicts(t, runReaders(t, exec.Command(node, filepath.Join("testdata", "readers", "readers.js"))))
	})
	t.Run("python", func(t *testing.T) {
		python := readerTool(t, "python3", "python3")
		checkVerdicts(t, runReaders(t, exec.Command(python, filepath.Join("testdata", "readers", "readers.py"))))
	})
	t.Run("nginx location ~*", func(t *testing.T) {
		checkVerdicts(t, readNginx(t, readerTool(t, "nginx", "nginx-light")))
	})
}

// readNginx runs nginx with one case-insensitive regex location (~*) per
// rule path and asks it where each row's spelling goes: nginx decodes the
// path, merges slashes and resolves dot segments before it matches.
func readNginx(t *testing.T, nginx string) readerVerdicts {
	dir := t.TempDir()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	var conf strings.Builder
	fmt.Fprintf(&conf, "daemon off; master_process off; pid %s/nginx.pid; error_log %s/error.log;\n", dir, dir)
	fmt.Fprintf(&conf, "events {}\nhttp {\n access_log off;\n client_body_temp_path %[1]s; proxy_temp_path %[1]s; fastcgi_temp_path %[1]s; uwsgi_temp_path %[1]s; scgi_temp_path %[1]s;\n", dir)
	fmt.Fprintf(&conf, " server {\n  listen %s;\n", addr)
	seen := map[string]bool{}
	for _, r := range pathReaderRows {
		if !seen[r.rule] {
			seen[r.rule] = true
			fmt.Fprintf(&conf, "  location ~* \"^%s$\" { return 299 %q; }\n", regexpQuote(r.rule), r.rule)
		}
	}
	conf.WriteString("  location / { return 404; }\n }\n}\n")
	confPath := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(confPath, []byte(conf.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(nginx, "-p", dir, "-c", confPath)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	v := readerVerdicts{rows: map[string][]int{}}
	for i, r := range pathReaderRows {
		var res *http.Response
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			if res, err = rawGet(addr, r.spelling); err == nil || time.Now().After(deadline) {
				break
			}
		}
		if err != nil {
			t.Fatalf("nginx: %v\n%s", err, stderr.Bytes())
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode == 299 && string(body) == r.rule {
			v.rows["nginx location ~*"] = append(v.rows["nginx location ~*"], i)
		}
	}
	return v
}

// rawGet sends GET target to addr as written, and returns the response.
func rawGet(addr, target string) (*http.Response, error) {
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(conn, "GET "+target+" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"); err != nil {
		conn.Close()
		return nil, err
	}
	b, err := io.ReadAll(conn)
	conn.Close()
	if err != nil {
		return nil, err
	}
	return http.ReadResponse(bufio.NewReader(bytes.NewReader(b)), nil)
}

// regexpQuote escapes what PCRE reads as syntax in s.
func regexpQuote(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`\.+*?()|[]{}^$`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}
