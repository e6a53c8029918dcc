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
//
// An application's text exposition longer than heldLimit is streamed the
// same way, after the rest of the answer (streamApps): a JVM service's runs
// to megabytes too, and Istio's agent copies it as it copies Envoy's. Its
// families are not known before, so none of Envoy's is held for it: a
// family the answer already has is left out of it and logged, where a
// shorter one is merged.

// heldLimit is how much of an application's text answer is held, to be
// merged; past it the answer is streamed. One window: at 256 KiB a 2 MB
// answer cost the idle agent 1.0-1.4 MiB more anon than at 64 KiB (#36).
const heldLimit = streamWindow

// streamEnvoy answers a text scrape whose Envoy answered text and whose
// other sources pass through (familyOrigins): the agent's families, Envoy's
// body streamed, then the applications' bodies, or, when one of them has
// a family Envoy has, the merge of those two; then those streamed.
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

	s := newLineStream(origins, true)
	if !m.streamSource(answer, s, http.MaxBytesReader(nil, envoy.Body, m.cfg.BodyLimit), sources[0],
		"metric family left out of Envoy's part of the merged metrics: it is the agent's, or an earlier part of Envoy's") {
		return // the caller has gone
	}

	if s.held.Len() == 0 {
		writeBodies(answer, results[1:])
	} else {
		// Envoy's families an application has too, merged as any clash is.
		results[0] = sourceResult{raw: &s.held}
		defer func() { results[0] = sourceResult{} }() // not a pooled buffer
		out.Reset()
		m.encode(out, format, m.merge(nil, sources, results))
		answer.Write(out.Bytes())
	}
	if streamed(results) {
		for name := range s.seen {
			origins[name] = false
		}
		m.streamApps(answer, origins, sources, results)
	}
}

// streamed reports whether an application's answer is left to streamApps.
func streamed(results []sourceResult) bool {
	for _, res := range results {
		if res.rest != nil {
			return true
		}
	}
	return false
}

// streamApps streams the applications' answers longer than heldLimit, at
// the end of a text answer whose families are written (its keys): their
// lines are left out of these, as are a family's split or repeated ones.
func (m *Handler) streamApps(answer *answerWriter, written map[string]bool, sources []source, results []sourceResult) {
	for i, res := range results {
		if res.rest == nil || answer.err != nil {
			continue
		}
		s := newLineStream(written, false)
		if !m.streamSource(answer, s, io.MultiReader(bytes.NewReader(res.raw.Bytes()), res.rest), sources[i],
			"metric family left out of the application's part of the merged metrics: the answer has it already, "+
				"or it is split (an exposition over 64 KiB is streamed as it comes, not merged)",
			"url", sources[i].url) {
			return // the caller has gone
		}
		for name := range s.seen {
			written[name] = false
		}
	}
}

// streamSource copies src's body into answer through s, a pooled window at
// a time, counts a failure of src's, and logs each family s left out once
// (why, with attrs); false: the caller has gone.
func (m *Handler) streamSource(answer *answerWriter, s *lineStream, body io.Reader, src source, why string, attrs ...any) bool {
	window, _ := m.windows.Get().(*[]byte)
	if window == nil {
		b := make([]byte, streamWindow, streamWindow+1) // the parser's spare byte (checkLines)
		window = &b
	}
	err := s.copy(answer, body, *window)
	m.windows.Put(window)
	if answer.err != nil {
		return false
	}
	if err != nil {
		m.failed(src.kind, &sourceError{url: src.url, msg: "streaming the answer", err: err})
	}
	for _, name := range s.leftOut {
		if _, logged := m.conflicts.LoadOrStore(name, true); !logged {
			m.log.Warn(why, append([]any{"family", name}, attrs...)...)
		}
	}
	return true
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

// streamWindow is how much of a streamed body is read, checked and written
// at a time; a line longer than it ends the stream.
const streamWindow = 64 << 10

// errLineTooLong ends a stream whose line does not fit the window.
var errLineTooLong = fmt.Errorf("a line longer than %d bytes", streamWindow)

type lineRoute int

const (
	routeWrite lineRoute = iota
	routeHold
	routeLeaveOut
)

// lineStream is one scrape's copy of a streamed exposition: Envoy's, or an
// application's (streamApps).
type lineStream struct {
	// origins are the families already in the answer (false) and, for
	// Envoy's, of the applications (true: held, merged after, when
	// holdShared; else left out as the others).
	origins    map[string]bool
	holdShared bool
	held       bytes.Buffer    // the lines of the applications' families
	seen       map[string]bool // families begun in this body
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

func newLineStream(origins map[string]bool, holdShared bool) *lineStream {
	return &lineStream{origins: origins, holdShared: holdShared, seen: map[string]bool{}, route: routeWrite}
}

// copy streams body into w through buf (streamWindow bytes).
func (s *lineStream) copy(w io.Writer, body io.Reader, buf []byte) error {
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
func (s *lineStream) window(w io.Writer, lines []byte) error {
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
func (s *lineStream) routeOf(line []byte) lineRoute {
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
// whether its lines are kept: a family already in the answer (the agent's;
// for an application's body, Envoy's too), or one of this body's begun
// before and left (a split), is left out; a held family stays held.
func (s *lineStream) begin(family []byte) bool {
	if string(family) == s.family {
		return s.route != routeLeaveOut
	}
	s.family = string(family)
	split := s.seen[s.family]
	s.typed, s.helped, s.sampled = false, false, false
	s.seen[s.family] = true
	application, known := s.origins[s.family]
	switch {
	case application && s.holdShared:
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

func (s *lineStream) note(family string) {
	for _, f := range s.leftOut {
		if f == family {
			return
		}
	}
	s.leftOut = append(s.leftOut, family)
}
