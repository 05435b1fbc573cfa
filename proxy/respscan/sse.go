package respscan

// maxEvent bounds the data of one event that is scanned: a larger event
// is scanned no further (its values do not count), and its bytes still
// pass.
const maxEvent = 1 << 20

// maxField bounds the bytes of a line's field name that are kept: "data"
// and the other fields of the format are short.
const maxField = 16

// SSE scans a text/event-stream (the WHATWG HTML standard's server-sent
// events) event by event: each event's data is a JSON document whose
// paths start at its root, and the last value seen for each path counts,
// over the whole stream. An event counts once it is dispatched (a blank
// line ends it); one cut short at the end of the stream does not.
type SSE struct {
	paths [][]string
	res   Result

	doc     *JSON // the current event's data
	lineSt  uint8 // 0 field name, 1 after "data:", 2 in data, 3 skipping the line
	field   [maxField]byte
	nField  int
	data    int  // bytes of data in the current event
	hasData bool // the event has a data line
	cr      bool // the last byte was '\r' (a "\r\n" is one line end)
}

// NewSSE returns a scanner for paths, each a list of keys from the root
// of an event's data.
func NewSSE(paths [][]string) *SSE {
	return &SSE{paths: paths, res: newResult(len(paths)), doc: NewJSON(paths)}
}

// Result is what the events dispatched so far reported.
func (s *SSE) Result() Result { return s.res }

// Write scans p; it returns len(p), nil.
func (s *SSE) Write(p []byte) (int, error) {
	for _, c := range p {
		s.step(c)
	}
	return len(p), nil
}

func (s *SSE) step(c byte) {
	if s.cr {
		s.cr = false
		if c == '\n' {
			return // the rest of "\r\n"
		}
	}
	if c == '\r' || c == '\n' {
		s.cr = c == '\r'
		s.endLine()
		return
	}
	switch s.lineSt {
	case 0:
		if c == ':' {
			if s.nField == 0 {
				s.lineSt = 3 // a comment
				return
			}
			s.lineSt = 3
			if string(s.field[:s.nField]) == "data" {
				s.dataLine()
				s.lineSt = 1
			}
			return
		}
		if s.nField == maxField {
			s.lineSt = 3
			return
		}
		s.field[s.nField] = c
		s.nField++
	case 1:
		s.lineSt = 2
		if c == ' ' {
			return // one space after the colon is not data
		}
		s.feed(c)
	case 2:
		s.feed(c)
	}
}

// dataLine starts a data line: lines after the first are joined with a
// line feed, which is white space to JSON.
func (s *SSE) dataLine() {
	if s.hasData {
		s.feed('\n')
	}
	s.hasData = true
}

func (s *SSE) feed(c byte) {
	if s.data++; s.data > maxEvent {
		return
	}
	s.doc.step(c)
}

// endLine ends a line; an empty one dispatches the event.
func (s *SSE) endLine() {
	empty := s.lineSt == 0 && s.nField == 0
	if s.lineSt == 0 && s.nField > 0 && string(s.field[:s.nField]) == "data" {
		s.dataLine() // "data" alone is a data line with no value
	}
	s.lineSt, s.nField = 0, 0
	if !empty {
		return
	}
	if s.hasData {
		s.dispatch()
	}
	s.hasData, s.data = false, 0
}

// dispatch counts the event's values when its data was one whole JSON
// value within maxEvent.
func (s *SSE) dispatch() {
	s.doc.End()
	if s.doc.Complete() && s.data <= maxEvent {
		r := s.doc.Result()
		for i := range r.Found {
			if r.Found[i] {
				s.res.Found[i], s.res.Values[i], s.res.Valid[i] = true, r.Values[i], r.Valid[i]
			}
		}
	}
	s.doc.reset()
}

// reset makes j ready for another document, keeping its storage.
func (j *JSON) reset() {
	clear(j.res.Found)
	clear(j.res.Values)
	clear(j.res.Valid)
	j.st, j.depth, j.target, j.esc, j.numLen, j.numBad = stValue, 0, -1, 0, 0, false
}
