package metricsmerge

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/textparse"
)

// Envoy's exposition is streamed into the answer, a window of whole lines
// at a time, as Istio's agent copies it (io.Copy in its handleStats): it
// grows with the sidecar's peers to megabytes (istio#29110: 8 MB a scrape),
// and holding it, and the answer made of it, cost a busy pod twice that
// between scrapes (#36). Each window is checked with Prometheus' parser
// before any of it is written, and each line is routed by its family:
//
//   - written, for a family that is new to the answer;
//   - held, for a family an application also has: merged with the
//     application's after the stream, as every other clash is (familySet);
//   - left out, for a family already in the answer: the agent's (Envoy
//     has no istio_agent_ family) or an earlier part of its own (Envoy
//     renders each family in one piece). A strict parser would refuse the
//     whole answer for it; it is logged once.
//
// A window that does not parse, a body over the limit or a read that fails
// ends the stream there: what was written before is whole lines, and the
// source is counted as failed.

// streamEnvoy answers a text scrape whose Envoy answered text and whose
// other sources pass through (passThrough): the agent's families, Envoy's
// body streamed, then the applications' bodies, or, when one of them has
// a family Envoy has, the merge of those two.
func (m *Handler) streamEnvoy(w http.ResponseWriter, envoy *http.Response, format expfmt.Format,
	agent []*dto.MetricFamily, origins map[string]bool, sources []source, results []sourceResult) {
	defer envoy.Body.Close()
	w.Header().Set("Content-Type", string(format))
	out := m.buffer(&m.sizes[answerSize])
	defer m.buffers.Put(out)
	m.encode(out, format, agent)
	m.sizes[answerSize].Store(int64(out.Len()))
	answer := &answerWriter{w: w}
	answer.Write(out.Bytes())

	s := newEnvoyStream(origins)
	window, _ := m.windows.Get().(*[]byte)
	if window == nil {
		b := make([]byte, streamWindow, streamWindow+1) // the parser's spare byte (checkLines)
		window = &b
	}
	err := s.copy(answer, http.MaxBytesReader(nil, envoy.Body, m.cfg.BodyLimit), *window)
	m.windows.Put(window)
	if answer.err != nil {
		return // the caller has gone
	}
	if err != nil {
		m.failed(failureEnvoy, &sourceError{url: sources[0].url, msg: "streaming the answer", err: err})
	}
	for _, name := range s.leftOut {
		if _, logged := m.conflicts.LoadOrStore(name, true); !logged {
			m.log.Warn("metric family left out of Envoy's part of the merged metrics: it is the agent's, or an earlier part of Envoy's",
				"family", name)
		}
	}

	if s.held.Len() == 0 {
		writeBodies(answer, results[1:])
		return
	}
	// Envoy's families an application has too, merged as any clash is.
	results[0] = sourceResult{raw: &s.held}
	defer func() { results[0] = sourceResult{} }() // not a pooled buffer
	out.Reset()
	m.encode(out, format, m.merge(nil, sources, results))
	answer.Write(out.Bytes())
}

// answerWriter keeps the first error writing the answer: the caller gone.
type answerWriter struct {
	w   io.Writer
	err error
}

func (a *answerWriter) Write(p []byte) (int, error) {
	if a.err != nil {
		return 0, a.err
	}
	n, err := a.w.Write(p)
	a.err = err
	return n, err
}

// streamWindow is how much of Envoy's body is read, checked and written at
// a time; a line longer than it ends the stream.
const streamWindow = 64 << 10

// errLineTooLong ends a stream whose line does not fit the window.
var errLineTooLong = fmt.Errorf("a line longer than %d bytes", streamWindow)

type lineRoute int

const (
	routeWrite lineRoute = iota
	routeHold
	routeLeaveOut
)

// envoyStream is one scrape's copy of Envoy's exposition.
type envoyStream struct {
	// origins are the families of the agent (false: already in the
	// answer) and of the applications (true: held, merged after).
	origins map[string]bool
	held    bytes.Buffer    // the lines of the applications' families
	seen    map[string]bool // families begun in this body
	// leftOut are the families left out, for the log.
	leftOut []string

	// The family of the last line, and its route; what its block has
	// had so far (a TYPE or HELP line after them is left out, as it
	// would make the answer unparseable).
	family                 string
	route                  lineRoute // the family's
	typed, helped, sampled bool
	block                  string // the family of the last TYPE line
	blockType              model.MetricType
}

func newEnvoyStream(origins map[string]bool) *envoyStream {
	return &envoyStream{origins: origins, seen: map[string]bool{}, route: routeWrite}
}

// copy streams body into w through buf (streamWindow bytes).
func (s *envoyStream) copy(w io.Writer, body io.Reader, buf []byte) error {
	n := 0
	for {
		m, err := body.Read(buf[n:])
		n += m
		eof := errors.Is(err, io.EOF)
		if err != nil && !eof {
			return err
		}
		if eof && n > 0 && buf[n-1] != '\n' {
			if n == len(buf) {
				return errLineTooLong
			}
			buf[n] = '\n' // the last line, as the answer goes on after it
			n++
		}
		// Windows of at least half the buffer: a parser a window.
		if n >= len(buf)/2 || eof {
			end := bytes.LastIndexByte(buf[:n], '\n') + 1
			if end == 0 && n == len(buf) {
				return errLineTooLong
			}
			if err := s.window(w, buf[:end]); err != nil {
				return err
			}
			n = copy(buf, buf[end:n])
		}
		if eof {
			return nil
		}
	}
}

// window checks whole lines and sends each where its family goes.
func (s *envoyStream) window(w io.Writer, lines []byte) error {
	if len(lines) == 0 {
		return nil
	}
	if err := checkLines(lines); err != nil {
		return err
	}
	run, start := routeWrite, 0 // the run of lines of one route not yet sent
	send := func(end int) error {
		switch chunk := lines[start:end]; {
		case len(chunk) == 0:
		case run == routeWrite:
			if _, err := w.Write(chunk); err != nil {
				return err
			}
		case run == routeHold:
			s.held.Write(chunk)
		}
		start = end
		return nil
	}
	for at := 0; at < len(lines); {
		end := at + bytes.IndexByte(lines[at:], '\n') + 1
		if route := s.routeOf(lines[at : end-1]); route != run {
			if err := send(at); err != nil {
				return err
			}
			run = route
		}
		at = end
	}
	return send(len(lines))
}

// checkLines parses whole lines with Prometheus' parser. The parser
// appends a newline to what it is given, which writes into the window's
// next byte (the start of the next window, or its spare byte): that byte
// is put back.
func checkLines(lines []byte) error {
	var next byte
	spare := len(lines) < cap(lines)
	if spare {
		next = lines[:len(lines)+1][len(lines)]
	}
	defer func() {
		if spare {
			lines[:len(lines)+1][len(lines)] = next
		}
	}()
	p := textparse.NewPromParser(lines, nil, false)
	for {
		if _, err := p.Next(); errors.Is(err, io.EOF) {
			return nil
		} else if err != nil {
			return err
		}
	}
}

// routeOf is where one line (without its newline) goes. The window has
// parsed, so the line is well formed.
func (s *envoyStream) routeOf(line []byte) lineRoute {
	switch {
	case len(line) == 0:
		return s.route
	case bytes.HasPrefix(line, []byte("# TYPE ")):
		fields := bytes.Fields(line[len("# TYPE "):])
		typ := model.MetricType(fields[1])
		if typ == "untyped" {
			typ = model.MetricTypeUnknown
		}
		if !s.begin(fields[0]) || s.typed || s.sampled {
			s.block, s.blockType = s.family, typ
			return routeLeaveOut
		}
		s.block, s.blockType = s.family, typ
		s.typed = true
		return s.route
	case bytes.HasPrefix(line, []byte("# HELP ")):
		if !s.begin(bytes.Fields(line[len("# HELP "):])[0]) || s.helped || s.sampled {
			return routeLeaveOut
		}
		s.helped = true
		return s.route
	case line[0] == '#':
		return s.route
	}
	family := line
	if i := bytes.IndexAny(line, "{ \t"); i >= 0 {
		family = line[:i]
	}
	if len(family) == 0 {
		// A quoted UTF-8 name inside the braces: its family is not
		// known without parsing the line, and Envoy writes none.
		s.note("{")
		return routeLeaveOut
	}
	// A sample of the last TYPE line's family (its _bucket, _sum, ...).
	// Compared as strings, not converted: no allocation a line.
	if b := s.block; b != "" && len(family) >= len(b) && string(family[:len(b)]) == b &&
		roleOfSuffix(s.blockType, string(family[len(b):])) != notInBlock {
		family = family[:len(b)]
	}
	if !s.begin(family) {
		return routeLeaveOut
	}
	s.sampled = true
	return s.route
}

// begin moves to family's block, if it is not the current one, and says
// whether its lines are kept: a family of the agent's, or one of Envoy's
// begun before and left (a split), is left out; a held family stays held.
func (s *envoyStream) begin(family []byte) bool {
	if string(family) == s.family {
		return s.route != routeLeaveOut
	}
	s.family = string(family)
	split := s.seen[s.family]
	s.typed, s.helped, s.sampled = false, false, false
	s.seen[s.family] = true
	application, known := s.origins[s.family]
	switch {
	case application:
		s.route = routeHold
	case known || split:
		s.route = routeLeaveOut
		s.note(s.family)
		return false
	default:
		s.route = routeWrite
	}
	return true
}

func (s *envoyStream) note(family string) {
	for _, f := range s.leftOut {
		if f == family {
			return
		}
	}
	s.leftOut = append(s.leftOut, family)
}
