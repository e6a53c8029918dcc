package metricsmerge

import (
	"errors"
	"fmt"
	"io"
	"math"
	"mime"
	"strconv"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/textparse"
	"google.golang.org/protobuf/proto"
)

// parseExposition reads a Prometheus text (0.0.4) or OpenMetrics body into
// metric families, in the order they appear; a name may come twice (a
// family split by other lines, or untyped samples before their TYPE line),
// which mergeFamilies resolves.
//
// The parser is Prometheus' own (model/textparse), not expfmt's: expfmt
// reads no OpenMetrics, and it rejects a whole body for a second TYPE line
// or a TYPE line after samples, which Prometheus itself ingests (and which
// is all Istio's concatenation ever asked of an exposition).
func parseExposition(body []byte, contentType string) ([]*dto.MetricFamily, error) {
	var p textparse.Parser
	if isOpenMetrics(contentType) {
		p = textparse.NewOpenMetricsParser(body, nil, textparse.WithOMParserSTSeriesSkipped())
	} else {
		p = textparse.NewPromParser(body, nil, false)
	}
	b := familyBuilder{help: map[string]string{}, arena: dtoArena{strs: map[string]*string{}}}
	var lset labels.Labels
	for {
		entry, err := p.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		switch entry {
		case textparse.EntryHelp:
			name, help := p.Help()
			b.help[string(name)] = string(help)
		case textparse.EntryType:
			name, typ := p.Type()
			b.startBlock(string(name), typ)
		case textparse.EntrySeries:
			_, ts, v := p.Series()
			if ts != nil { // the parser reuses it
				t := *ts
				ts = &t
			}
			p.Labels(&lset)
			if err := b.add(lset, ts, v); err != nil {
				return nil, err
			}
		}
	}
	b.finish()
	return b.families, nil
}

func isOpenMetrics(contentType string) bool {
	mt, _, err := mime.ParseMediaType(contentType)
	return err == nil && mt == expfmt.OpenMetricsType
}

// familyBuilder groups a parser's samples into families: the samples that
// follow a TYPE line and carry its name (with the suffixes of its type) form
// that family; any other sample is untyped, as Prometheus reads it.
type familyBuilder struct {
	families []*dto.MetricFamily
	help     map[string]string

	// The block opened by the last TYPE line.
	name string
	typ  model.MetricType
	// fam is the block's family once it has a sample; grouped holds its
	// histograms or summaries by label set.
	fam     *dto.MetricFamily
	grouped map[string]*dto.Metric
	// untyped is the family of the last untyped sample, continued by the
	// next sample of the same name.
	untyped *dto.MetricFamily

	arena dtoArena
}

func (b *familyBuilder) startBlock(name string, typ model.MetricType) {
	b.name, b.typ, b.fam, b.grouped, b.untyped = name, typ, nil, nil, nil
}

// sampleRole is what a sample is to its family.
type sampleRole int

const (
	notInBlock sampleRole = iota
	value                 // counter, gauge, unknown, info, stateset
	bucket                // histogram _bucket
	quantile              // summary sample with a quantile label
	sum                   // _sum, _gsum
	count                 // _count, _gcount
	skipped               // _created: no place in the text format
)

// role places a sample of the given name in the current block.
func (b *familyBuilder) role(name string) sampleRole { return roleInBlock(b.name, b.typ, name) }

// roleInBlock places a sample of the given name in the block opened by the
// TYPE line of block with type typ: the names a family's samples carry in
// the text format and OpenMetrics.
func roleInBlock(block string, typ model.MetricType, name string) sampleRole {
	suffix, ok := strings.CutPrefix(name, block)
	if !ok || block == "" {
		return notInBlock
	}
	return roleOfSuffix(typ, suffix)
}

// roleOfSuffix is what the rest of a sample's name after its family's name
// makes it.
func roleOfSuffix(typ model.MetricType, suffix string) sampleRole {
	switch typ {
	case model.MetricTypeCounter:
		switch suffix {
		case "", "_total": // text names the family foo_total, OpenMetrics foo
			return value
		case "_created":
			return skipped
		}
	case model.MetricTypeGauge, model.MetricTypeUnknown, model.MetricTypeStateset:
		if suffix == "" {
			return value
		}
	case model.MetricTypeInfo:
		if suffix == "_info" {
			return value
		}
	case model.MetricTypeHistogram, model.MetricTypeGaugeHistogram:
		switch suffix {
		case "_bucket":
			return bucket
		case "_sum", "_gsum":
			return sum
		case "_count", "_gcount":
			return count
		case "_created":
			return skipped
		}
	case model.MetricTypeSummary:
		switch suffix {
		case "":
			return quantile
		case "_sum":
			return sum
		case "_count":
			return count
		case "_created":
			return skipped
		}
	}
	return notInBlock
}

func (b *familyBuilder) add(lset labels.Labels, ts *int64, v float64) error {
	name := lset.Get(labels.MetricName)
	role := b.role(name)
	switch role {
	case skipped:
		return nil
	case notInBlock:
		if b.untyped == nil || b.untyped.GetName() != name {
			b.untyped = b.newFamily(name, dto.MetricType_UNTYPED)
		}
		b.untyped.Metric = append(b.untyped.Metric, b.arena.scalar(b.arena.labelPairs(lset, ""), ts, dto.MetricType_UNTYPED, v))
		return nil
	}
	b.untyped = nil
	if b.fam == nil {
		b.fam = b.newFamily(b.familyName(name), dtoType(b.typ))
		b.grouped = map[string]*dto.Metric{}
	}
	if role == value {
		b.fam.Metric = append(b.fam.Metric, b.arena.scalar(b.arena.labelPairs(lset, ""), ts, b.fam.GetType(), v))
		return nil
	}
	return b.addToGroup(lset, role, ts, v)
}

// addToGroup adds a histogram or summary sample to the metric of its label
// set (the labels without le or quantile).
func (b *familyBuilder) addToGroup(lset labels.Labels, role sampleRole, ts *int64, v float64) error {
	bound := ""
	switch role {
	case bucket:
		bound = lset.Get(model.BucketLabel)
	case quantile:
		bound = lset.Get(model.QuantileLabel)
	}
	skip := ""
	switch role {
	case bucket:
		skip = model.BucketLabel
	case quantile:
		skip = model.QuantileLabel
	}
	pairs := b.arena.labelPairs(lset, skip)
	key := labelKey(pairs)
	m := b.grouped[key]
	if m == nil {
		m = &dto.Metric{Label: pairs, TimestampMs: ts}
		if b.fam.GetType() == dto.MetricType_SUMMARY {
			m.Summary = &dto.Summary{}
		} else {
			m.Histogram = &dto.Histogram{}
		}
		b.grouped[key] = m
		b.fam.Metric = append(b.fam.Metric, m)
	}
	var boundValue float64
	if role == bucket || role == quantile {
		f, err := strconv.ParseFloat(bound, 64)
		if err != nil {
			return fmt.Errorf("%s: %q is not a number: %w", b.name, bound, err)
		}
		boundValue = f
	}
	switch {
	case role == bucket:
		bk := &dto.Bucket{UpperBound: proto.Float64(boundValue)}
		if n, ok := asCount(v); ok {
			bk.CumulativeCount = proto.Uint64(n)
		} else {
			bk.CumulativeCountFloat = proto.Float64(v)
		}
		m.Histogram.Bucket = append(m.Histogram.Bucket, bk)
	case role == quantile:
		m.Summary.Quantile = append(m.Summary.Quantile, &dto.Quantile{Quantile: proto.Float64(boundValue), Value: proto.Float64(v)})
	case role == sum && m.Summary != nil:
		m.Summary.SampleSum = proto.Float64(v)
	case role == sum:
		m.Histogram.SampleSum = proto.Float64(v)
	case role == count && m.Summary != nil:
		n, _ := asCount(v)
		m.Summary.SampleCount = proto.Uint64(n)
	case role == count:
		if n, ok := asCount(v); ok {
			m.Histogram.SampleCount = proto.Uint64(n)
		} else {
			m.Histogram.SampleCountFloat = proto.Float64(v)
		}
	}
	return nil
}

// familyName is the family's name as client_golang names it, which is what
// expfmt's encoders expect: a counter carries its _total, an info metric
// its _info.
func (b *familyBuilder) familyName(sample string) string {
	switch b.typ {
	case model.MetricTypeCounter, model.MetricTypeInfo:
		return sample
	}
	return b.name
}

func (b *familyBuilder) newFamily(name string, typ dto.MetricType) *dto.MetricFamily {
	f := &dto.MetricFamily{Name: proto.String(name), Type: typ.Enum()}
	if h, ok := b.help[name]; ok {
		f.Help = proto.String(h)
	} else if h, ok := b.help[b.name]; ok && typ != dto.MetricType_UNTYPED {
		f.Help = proto.String(h)
	}
	b.families = append(b.families, f)
	return f
}

// finish sets the help texts that came after their families' samples.
func (b *familyBuilder) finish() {
	for _, f := range b.families {
		if f.Help == nil {
			if h, ok := b.help[f.GetName()]; ok {
				f.Help = proto.String(h)
			}
		}
	}
}

// dtoType maps a parsed type to the client model's; OpenMetrics' info and
// stateset are gauges in the text format.
func dtoType(t model.MetricType) dto.MetricType {
	switch t {
	case model.MetricTypeCounter:
		return dto.MetricType_COUNTER
	case model.MetricTypeGauge, model.MetricTypeInfo, model.MetricTypeStateset:
		return dto.MetricType_GAUGE
	case model.MetricTypeHistogram:
		return dto.MetricType_HISTOGRAM
	case model.MetricTypeGaugeHistogram:
		return dto.MetricType_GAUGE_HISTOGRAM
	case model.MetricTypeSummary:
		return dto.MetricType_SUMMARY
	}
	return dto.MetricType_UNTYPED
}

// dtoArena hands out the client model's values in blocks, and each
// distinct string once: a source's 5,000 series would otherwise cost some
// ten allocations each, most of them for label names and values that
// repeat (an Envoy cluster name is in every cluster family).
type dtoArena struct {
	strs    map[string]*string
	pairs   []dto.LabelPair
	ptrs    []*dto.LabelPair
	samples []scalarSample
}

// arenaBlock is how many values of a kind one allocation makes.
const arenaBlock = 256

// scalarSample is one counter, gauge or untyped sample, allocated together.
type scalarSample struct {
	metric  dto.Metric
	counter dto.Counter
	gauge   dto.Gauge
	untyped dto.Untyped
	value   float64
}

func (a *dtoArena) str(s string) *string {
	if p, ok := a.strs[s]; ok {
		return p
	}
	p := &s
	a.strs[s] = p
	return p
}

// labelPairs are a sample's labels without its name and without skip (le
// or quantile, which place it in its histogram or summary).
func (a *dtoArena) labelPairs(lset labels.Labels, skip string) []*dto.LabelPair {
	n := lset.Len()
	if cap(a.pairs)-len(a.pairs) < n {
		a.pairs = make([]dto.LabelPair, 0, max(arenaBlock, n))
	}
	if cap(a.ptrs)-len(a.ptrs) < n {
		a.ptrs = make([]*dto.LabelPair, 0, max(arenaBlock, n))
	}
	start := len(a.ptrs)
	lset.Range(func(l labels.Label) {
		if l.Name == labels.MetricName || l.Name == skip {
			return
		}
		a.pairs = a.pairs[:len(a.pairs)+1]
		p := &a.pairs[len(a.pairs)-1]
		p.Name, p.Value = a.str(l.Name), a.str(l.Value)
		a.ptrs = append(a.ptrs, p)
	})
	return a.ptrs[start:len(a.ptrs):len(a.ptrs)] // full: an append copies
}

// scalar is a sample of a scalar family of type t.
func (a *dtoArena) scalar(pairs []*dto.LabelPair, ts *int64, t dto.MetricType, v float64) *dto.Metric {
	if len(a.samples) == cap(a.samples) {
		a.samples = make([]scalarSample, 0, arenaBlock)
	}
	a.samples = a.samples[:len(a.samples)+1]
	s := &a.samples[len(a.samples)-1]
	s.value = v
	s.metric.Label, s.metric.TimestampMs = pairs, ts
	switch t {
	case dto.MetricType_COUNTER:
		s.counter.Value = &s.value
		s.metric.Counter = &s.counter
	case dto.MetricType_GAUGE:
		s.gauge.Value = &s.value
		s.metric.Gauge = &s.gauge
	default:
		s.untyped.Value = &s.value
		s.metric.Untyped = &s.untyped
	}
	return &s.metric
}

// labelKey identifies a label set (sorted, as the parser gives them).
func labelKey(pairs []*dto.LabelPair) string {
	var sb strings.Builder
	for _, p := range pairs {
		sb.WriteString(p.GetName())
		sb.WriteByte(0xff)
		sb.WriteString(p.GetValue())
		sb.WriteByte(0xff)
	}
	return sb.String()
}

// asCount is v as a whole count, if it is one.
func asCount(v float64) (uint64, bool) {
	if v < 0 || v != math.Trunc(v) || v > math.MaxUint64/2 {
		return 0, false
	}
	return uint64(v), true
}
