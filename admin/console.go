package admin

import (
	"bytes"
	"embed"
	"html/template"
	"mime"
	"net/http"
	"path"
	"strconv"

	"github.com/sluicehq/sluice/proxy"
)

// The console: GET / is a page rendered from console/index.html, which
// loads console/app.js and console/style.css from the same listener. Every
// file is embedded in the binary, so the console works without any
// network but the admin listener's: no CDN, no external font.
//
// The page holds no data: it says only whether a token is needed, and the
// script reads everything else from the /v1 API with the token the
// operator types, sent as a bearer header (never in a URL or a cookie),
// and kept in the tab's sessionStorage until the tab is closed or "Forget
// token" is pressed. So GET / and its files are served without the token,
// like /healthz.

//go:embed console
var consoleFiles embed.FS

// consolePage is the page's template.
var consolePage = template.Must(template.ParseFS(consoleFiles, "console/index.html"))

// consoleAssets are the files the page loads, by name, with their content
// type; index.html is the template and not served as a file.
var consoleAssets = func() map[string]asset {
	m := map[string]asset{}
	entries, err := consoleFiles.ReadDir("console")
	if err != nil {
		panic(err)
	}
	for _, e := range entries {
		if e.Name() == "index.html" {
			continue
		}
		body, err := consoleFiles.ReadFile("console/" + e.Name())
		if err != nil {
			panic(err)
		}
		m[e.Name()] = asset{contentType: mime.TypeByExtension(path.Ext(e.Name())), body: body}
	}
	return m
}()

type asset struct {
	contentType string
	body        []byte
}

// contentSecurityPolicy lets the console load scripts, styles, images and
// data from its own origin only: no inline script or style, no event
// handler attribute, no eval; no framing by any page (clickjacking); no
// <base> that would move its relative URLs; and (in Chromium) no string
// ever assigned to innerHTML or a similar sink, so text from the API can
// only ever become text.
const contentSecurityPolicy = "default-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'; require-trusted-types-for 'script'"

// secure adds the console's security headers to every response of h.
func secure(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hd := w.Header()
		hd.Set("Content-Security-Policy", contentSecurityPolicy)
		hd.Set("X-Content-Type-Options", "nosniff")
		hd.Set("X-Frame-Options", "DENY") // frame-ancestors for older browsers
		hd.Set("Referrer-Policy", "no-referrer")
		h.ServeHTTP(w, r)
	})
}

// serveConsole adds the console's page and files to mux.
func serveConsole(mux *http.ServeMux, tokenRequired bool) {
	var page bytes.Buffer
	if err := consolePage.Execute(&page, struct{ TokenRequired bool }{tokenRequired}); err != nil {
		panic(err) // the template is embedded: a test renders it
	}
	html := page.Bytes()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		writeAsset(w, asset{contentType: "text/html; charset=utf-8", body: html})
	})
	mux.HandleFunc("GET /console/{file}", func(w http.ResponseWriter, r *http.Request) {
		a, ok := consoleAssets[r.PathValue("file")]
		if !ok {
			proxy.WriteProblem(w, proxy.Problem{Status: http.StatusNotFound, Detail: "no such console file"})
			return
		}
		writeAsset(w, a)
	})
}

func writeAsset(w http.ResponseWriter, a asset) {
	h := w.Header()
	h.Set("Content-Type", a.contentType)
	h.Set("Content-Length", strconv.Itoa(len(a.body)))
	// The files change with the binary; no-cache makes a browser ask again
	// after an upgrade (a cheap answer on the admin listener).
	h.Set("Cache-Control", "no-cache")
	w.Write(a.body) //nolint:errcheck // the client may be gone
}
