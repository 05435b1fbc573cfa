package proctest

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

// Raw writes request, an HTTP/1.1 request as raw bytes, on a new TCP
// connection to addr, so that no client library respells or refuses it,
// and reads one response; it returns the response (its body closed) and
// the body. The request is written while the response is read, since a
// server may answer (431) before it has read all of it; with halfClose
// the connection's write side is closed once it is written, as a client
// that stops sending does. The connection has 10 seconds; a failure to
// connect or to read a response fails t.
func Raw(t testing.TB, addr, request string, halfClose bool) (*http.Response, string) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second)) //nolint:errcheck // a fresh connection
	go func() {
		if _, err := io.WriteString(c, request); err == nil && halfClose {
			c.(*net.TCPConn).CloseWrite() //nolint:errcheck // the response says what came of it
		}
	}()
	res, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("reading the response: %v", err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	return res, string(b)
}

// AcceptWebSocket answers, from an upstream's handler, a WebSocket
// upgrade with 101 Switching Protocols on the connection it hijacks from
// w, and returns the connection, which the caller closes, and its
// buffered reader and writer. When w cannot be hijacked it reports the
// error on t and returns a nil connection.
func AcceptWebSocket(t testing.TB, w http.ResponseWriter) (net.Conn, *bufio.ReadWriter) {
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		t.Error(err)
		return nil, nil
	}
	brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
	brw.Flush()
	return conn, brw
}
