package proxy

import (
	"bufio"
	"io"
	"net/http"
	"strings"
	"testing"
)

// The cost of reading charges from responses: the same route through a
// rule with charge=json(...) and through one without, for a large JSON
// body (throughput) and for the first event of an SSE stream (latency).
// Compare the pairs of one run with benchstat; they share the machine.

// bigJSON is a 1 MiB chat completion whose usage comes last.
var bigJSON = []byte(`{"choices":[{"message":{"content":"` + strings.Repeat("lorem ipsum ", 1<<20/12) +
	`"}}],"usage":{"prompt_tokens":3,"completion_tokens":5,"total_tokens":8}}`)

// chargeRoutes are the two rules each benchmark compares: the same route
// with and without a charge.
var chargeRoutes = []struct{ name, rule string }{
	{"plain", "tpm: POST /v1/* by tenant 1000000000000/1m"},
	{"charge", "tpm: POST /v1/* by tenant 1000000000000/1m charge=json(usage.total_tokens)"},
}

// chat sends one chat completion request as tenant acme.
func chat(b *testing.B, client *http.Client, base string) *http.Response {
	req, _ := http.NewRequest("POST", base+"/v1/chat", nil)
	req.Header.Set("X-Tenant-ID", "acme")
	res, err := client.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	return res
}

func BenchmarkChargeJSON(b *testing.B) {
	up := fakeUpstream(b, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write(bigJSON)
	})
	for _, tc := range chargeRoutes {
		b.Run(tc.name, func(b *testing.B) {
			g := newGateway(b, up, tc.rule, gatewayOpts{})
			client := g.Client()
			b.SetBytes(int64(len(bigJSON)))
			b.ResetTimer()
			for b.Loop() {
				res := chat(b, client, g.URL)
				n, _ := io.Copy(io.Discard, res.Body)
				res.Body.Close()
				if n != int64(len(bigJSON)) {
					b.Fatalf("%d bytes, want %d", n, len(bigJSON))
				}
			}
		})
	}
}

// BenchmarkChargeSSEFirstEvent times a request until its first event
// arrives; the upstream then ends the stream with its usage.
func BenchmarkChargeSSEFirstEvent(b *testing.B) {
	up := fakeUpstream(b, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"Hel\"}}]}\n\n")
		w.(http.Flusher).Flush()
		io.WriteString(w, "data: {\"choices\":[],\"usage\":{\"total_tokens\":9}}\n\ndata: [DONE]\n\n")
	})
	for _, tc := range chargeRoutes {
		b.Run(tc.name, func(b *testing.B) {
			g := newGateway(b, up, tc.rule, gatewayOpts{})
			client := g.Client()
			for b.Loop() {
				res := chat(b, client, g.URL)
				rd := bufio.NewReader(res.Body)
				if line, err := rd.ReadString('\n'); err != nil || !strings.HasPrefix(line, "data: ") {
					b.Fatalf("%q %v", line, err)
				}
				b.StopTimer()
				io.Copy(io.Discard, rd)
				res.Body.Close()
				b.StartTimer()
			}
		})
	}
}
