package respscan_test

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/proxy/respscan"
)

var usagePaths = [][]string{{"usage", "total_tokens"}}

// feed writes doc to w in pieces of n bytes.
func feed(w interface{ Write([]byte) (int, error) }, doc string, n int) {
	for len(doc) > 0 {
		k := min(n, len(doc))
		w.Write([]byte(doc[:k]))
		doc = doc[k:]
	}
}

func TestJSON(t *testing.T) {
	big := strings.Repeat("x", 1<<20)
	for _, tc := range []struct {
		name, doc string
		paths     [][]string
		sum       int64
		ok, bad   bool
	}{
		{"OpenAI", `{"id":"c1","choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":9,"completion_tokens":12,"total_tokens":21}}`, usagePaths, 21, true, false},
		{"after 1 MiB of content", `{"choices":[{"message":{"content":"` + big + `"}}],"usage":{"total_tokens":7}}`, usagePaths, 7, true, false},
		{"two paths", `{"usage":{"input_tokens":10,"output_tokens":32}}`, [][]string{{"usage", "input_tokens"}, {"usage", "output_tokens"}}, 42, true, false},
		{"one path of two present", `{"usage":{"input_tokens":10}}`, [][]string{{"usage", "input_tokens"}, {"usage", "output_tokens"}}, 10, true, false},
		{"missing", `{"error":{"message":"rate limited"}}`, usagePaths, 0, false, false},
		{"an error page", `<html><body>502</body></html>`, usagePaths, 0, false, false},
		{"a key in a string is not a key", `{"content":"\"usage\":{\"total_tokens\":99}","usage":{"total_tokens":3}}`, usagePaths, 3, true, false},
		{"nested deeper is not the path", `{"x":{"usage":{"total_tokens":5}}}`, usagePaths, 0, false, false},
		{"in an array is not the path", `[{"usage":{"total_tokens":5}}]`, usagePaths, 0, false, false},
		{"the last value counts", `{"usage":{"total_tokens":1},"usage":{"total_tokens":4}}`, usagePaths, 4, true, false},
		{"a fraction", `{"usage":{"total_tokens":2.5}}`, usagePaths, 0, true, true},
		{"an exponent", `{"usage":{"total_tokens":1e3}}`, usagePaths, 0, true, true},
		{"negative", `{"usage":{"total_tokens":-4}}`, usagePaths, 0, true, true},
		{"a string", `{"usage":{"total_tokens":"12"}}`, usagePaths, 0, true, true},
		{"null", `{"usage":{"total_tokens":null}}`, usagePaths, 0, true, true},
		{"an object", `{"usage":{"total_tokens":{"n":1}}}`, usagePaths, 0, true, true},
		{"leading zero", `{"usage":{"total_tokens":012}}`, usagePaths, 0, true, true},
		{"too large", `{"usage":{"total_tokens":99999999999999999999999}}`, usagePaths, 0, true, true},
		{"zero", `{"usage":{"total_tokens":0}}`, usagePaths, 0, true, false},
		{"escaped key", `{"us\u0061ge":{"total_tokens":5}}`, usagePaths, 0, false, false},
		{"white space", " {\n \"usage\" : { \"total_tokens\" : 8 } } \n", usagePaths, 8, true, false},
		{"deep nesting", strings.Repeat(`{"a":`, 200) + `1` + strings.Repeat(`}`, 200), [][]string{{"a"}}, 0, true, true}, // an object at the path
		{"deep then the path", `{"d":` + strings.Repeat(`[`, 100) + strings.Repeat(`]`, 100) + `,"usage":{"total_tokens":6}}`, usagePaths, 6, true, false},
		{"deep objects then the path", `{"d":` + strings.Repeat(`{"k":`, 100) + `1` + strings.Repeat(`}`, 100) + `,"usage":{"total_tokens":6}}`, usagePaths, 6, true, false},
	} {
		for _, n := range []int{1, 3, 4096} {
			j := respscan.NewJSON(tc.paths)
			feed(j, tc.doc, n)
			j.End()
			sum, ok, bad := j.Result().Sum()
			if ok != tc.ok || bad != tc.bad || (!bad && sum != tc.sum) {
				t.Errorf("%s (pieces of %d): sum %d ok %v invalid %v, want %d %v %v", tc.name, n, sum, ok, bad, tc.sum, tc.ok, tc.bad)
			}
		}
	}
}

// openAIStream is a chat completion streamed with
// stream_options.include_usage: the usage comes in a last chunk.
const openAIStream = "data: {\"id\":\"c\",\"choices\":[{\"delta\":{\"content\":\"Hel\"}}],\"usage\":null}\n\n" +
	"data: {\"id\":\"c\",\"choices\":[{\"delta\":{\"content\":\"lo\"}}],\"usage\":null}\n\n" +
	"data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2,\"total_tokens\":7}}\n\n" +
	"data: [DONE]\n\n"

// anthropicStream is a Messages API stream: input tokens in
// message_start, output tokens in message_delta.
const anthropicStream = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"usage\":{\"input_tokens\":25,\"output_tokens\":1}}}\n\n" +
	"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"text\":\"Hi\"}}\n\n" +
	": a comment\n\n" +
	"event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":15}}\n\n" +
	"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"

var anthropicPaths = [][]string{{"message", "usage", "input_tokens"}, {"usage", "output_tokens"}}

func TestSSE(t *testing.T) {
	for _, tc := range []struct {
		name, stream string
		paths        [][]string
		sum          int64
		ok, bad      bool
	}{
		{"OpenAI with include_usage", openAIStream, usagePaths, 7, true, false},
		// "usage":null in every chunk: nothing at usage.total_tokens.
		{"OpenAI without include_usage", strings.ReplaceAll(openAIStream, "\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2,\"total_tokens\":7}", "\"usage\":null"), usagePaths, 0, false, false},
		{"Anthropic", anthropicStream, anthropicPaths, 40, true, false},
		{"CRLF line ends", strings.ReplaceAll(anthropicStream, "\n", "\r\n"), anthropicPaths, 40, true, false},
		{"CR line ends", strings.ReplaceAll(anthropicStream, "\n", "\r"), anthropicPaths, 40, true, false},
		{"cut off in the usage event", anthropicStream[:strings.Index(anthropicStream, "\"output_tokens\":15")+10], anthropicPaths, 25, true, false},
		{"data on several lines", "data: {\"usage\":\ndata: {\"total_tokens\":9}}\n\n", usagePaths, 9, true, false},
		{"no space after the colon", "data:{\"usage\":{\"total_tokens\":4}}\n\n", usagePaths, 4, true, false},
		{"a field that is not data", "event: {\"usage\":{\"total_tokens\":4}}\n\n", usagePaths, 0, false, false},
	} {
		for _, n := range []int{1, 2, 7, 4096} {
			s := respscan.NewSSE(tc.paths)
			feed(s, tc.stream, n)
			sum, ok, bad := s.Result().Sum()
			if ok != tc.ok || bad != tc.bad || (!bad && sum != tc.sum) {
				t.Errorf("%s (pieces of %d): sum %d ok %v invalid %v, want %d %v %v", tc.name, n, sum, ok, bad, tc.sum, tc.ok, tc.bad)
			}
		}
	}
}

// FuzzJSON feeds any bytes, in any pieces: the scanner never panics, and
// on a valid document it finds what encoding/json finds.
func FuzzJSON(f *testing.F) {
	f.Add([]byte(`{"usage":{"total_tokens":21}}`), uint8(3))
	f.Add([]byte(`{"usage":{"total_tokens":2.5},"x":[1,{"y":"\u00e9"}]}`), uint8(1))
	f.Add([]byte(`[[[[{"usage":1}]]]]`), uint8(2))
	f.Fuzz(func(t *testing.T, doc []byte, n uint8) {
		j := respscan.NewJSON(usagePaths)
		orig := bytes.Clone(doc)
		feed(j, string(doc), int(n)+1)
		j.End()
		if !bytes.Equal(doc, orig) {
			t.Fatal("the scanner changed its input")
		}
		var v struct {
			Usage *struct {
				TotalTokens json.RawMessage `json:"total_tokens"`
			} `json:"usage"`
		}
		if json.Unmarshal(doc, &v) != nil || !json.Valid(doc) || bytes.Count(doc, []byte(`"usage"`)) > 1 || bytes.Count(doc, []byte(`"total_tokens"`)) > 1 || bytes.Contains(doc, []byte(`\u`)) ||
			// encoding/json matches keys in any case; a path's keys are exact.
			bytes.Count(bytes.ToLower(doc), []byte(`"usage"`)) != bytes.Count(doc, []byte(`"usage"`)) ||
			bytes.Count(bytes.ToLower(doc), []byte(`"total_tokens"`)) != bytes.Count(doc, []byte(`"total_tokens"`)) {
			return // only documents whose reading is not in doubt
		}
		sum, ok, bad := j.Result().Sum()
		if v.Usage == nil || v.Usage.TotalTokens == nil {
			if ok {
				t.Fatalf("%s: found %d where encoding/json finds nothing", doc, sum)
			}
			return
		}
		var want int64
		valid := json.Unmarshal(v.Usage.TotalTokens, &want) == nil && want >= 0 && !bytes.ContainsAny(v.Usage.TotalTokens, ".eE-") && (len(v.Usage.TotalTokens) == 1 || v.Usage.TotalTokens[0] != '0')
		if !ok || bad == valid || (valid && sum != want) {
			t.Fatalf("%s: sum %d ok %v invalid %v; encoding/json reads %s", doc, sum, ok, bad, v.Usage.TotalTokens)
		}
	})
}

// FuzzSSE feeds any bytes in any pieces: the scanner never panics.
func FuzzSSE(f *testing.F) {
	f.Add([]byte(openAIStream), uint8(5))
	f.Add([]byte(anthropicStream), uint8(1))
	f.Fuzz(func(t *testing.T, stream []byte, n uint8) {
		s := respscan.NewSSE(anthropicPaths)
		orig := bytes.Clone(stream)
		feed(s, string(stream), int(n)+1)
		if !bytes.Equal(stream, orig) {
			t.Fatal("the scanner changed its input")
		}
		s.Result().Sum()
	})
}
