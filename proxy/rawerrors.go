package proxy

import (
	"bytes"
	"encoding/json"
	"net"
	"strconv"
	"strings"
)

// ProblemListener wraps l so that the error responses net/http's server
// writes by itself, before any handler runs, are application/problem+json
// like every other error sluice sends. net/http answers these requests
// with a fixed plain-text response written straight to the connection:
//
//   - 400 Bad Request: a malformed request line, an invalid request URI
//     (such as a path with a bad percent-escape), a malformed header, a
//     missing or malformed Host header;
//   - 431 Request Header Fields Too Large: headers beyond MaxHeaderBytes;
//   - 501 Not Implemented: a Transfer-Encoding it does not implement;
//   - 505 HTTP Version Not Supported: an unsupported protocol version.
//
// Such a response is recognised by its exact shape (a status line, then
// "Content-Type: text/plain; charset=utf-8" and "Connection: close" in that
// order, which the ResponseWriter never writes since it sorts headers, and
// a body repeating the status), and replaced whole. onStatus, when not nil,
// is told the status of each one replaced.
func ProblemListener(l net.Listener, onStatus func(code int)) net.Listener {
	return &problemListener{Listener: l, onStatus: onStatus}
}

type problemListener struct {
	net.Listener
	onStatus func(int)
}

func (l *problemListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &problemConn{Conn: c, onStatus: l.onStatus}, nil
}

// problemConn rewrites net/http's own plain-text error responses.
type problemConn struct {
	net.Conn
	onStatus func(int)
}

// Write passes p through unless it is one whole net/http error response,
// which it replaces by the problem+json form, reporting p's length as
// written.
func (c *problemConn) Write(p []byte) (int, error) {
	code, detail, ok := parseServerError(p)
	if !ok {
		return c.Conn.Write(p)
	}
	if c.onStatus != nil {
		c.onStatus(code)
	}
	if _, err := c.Conn.Write(problemResponse(code, detail)); err != nil {
		return 0, err
	}
	return len(p), nil
}

// CloseWrite half-closes the connection when the wrapped one can, as
// net/http does after its 431 so that the client reads the answer.
func (c *problemConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// serverErrorHeaders are the headers of net/http's own error responses.
const serverErrorHeaders = "\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"

// parseServerError recognises one of net/http's own error responses:
// "HTTP/1.1 " + status + serverErrorHeaders + body, where the body repeats
// the status ("400 Bad Request", "400 Bad Request: invalid header name")
// or, for 501, is "Unsupported transfer encoding". It returns the code and
// what the status says beyond its reason phrase.
func parseServerError(p []byte) (code int, detail string, ok bool) {
	const prefix = "HTTP/1.1 "
	if len(p) < len(prefix)+3 || p[0] != 'H' || !bytes.HasPrefix(p, []byte(prefix)) {
		return 0, "", false
	}
	end := bytes.IndexByte(p, '\r')
	if end < 0 || end > 256 || !bytes.HasPrefix(p[end:], []byte(serverErrorHeaders)) {
		return 0, "", false
	}
	status := string(p[len(prefix):end])
	if len(status) < 4 || status[3] != ' ' {
		return 0, "", false
	}
	code, err := strconv.Atoi(status[:3])
	if err != nil || code < 400 || code > 599 {
		return 0, "", false
	}
	body := string(p[end+len(serverErrorHeaders):])
	switch {
	case body == status:
		_, detail, _ = strings.Cut(status[4:], ": ")
	case code == 501 && body == "Unsupported transfer encoding":
		return code, "the request's Transfer-Encoding is not supported", true
	default:
		return 0, "", false
	}
	return code, serverErrorDetail(code, detail), true
}

// serverErrorDetail says what is wrong with a request net/http refused.
func serverErrorDetail(code int, detail string) string {
	switch {
	case detail != "":
		return "malformed request: " + detail
	case code == 400:
		return "malformed request: the request line, its URI or a header could not be parsed"
	case code == 431:
		return "the request's headers are too large"
	}
	return "the request could not be read"
}

// problemResponse is a whole HTTP/1.1 response carrying the problem
// details of code, after which the connection closes.
func problemResponse(code int, detail string) []byte {
	body, err := json.Marshal(Problem{Type: "about:blank", Title: statusTitle(code), Status: code, Detail: detail})
	if err != nil { // strings and ints always marshal
		panic(err)
	}
	var b bytes.Buffer
	b.WriteString("HTTP/1.1 ")
	b.WriteString(strconv.Itoa(code))
	b.WriteByte(' ')
	b.WriteString(statusTitle(code))
	b.WriteString("\r\nContent-Type: application/problem+json\r\nContent-Length: ")
	b.WriteString(strconv.Itoa(len(body)))
	b.WriteString("\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n")
	b.Write(body)
	return b.Bytes()
}
