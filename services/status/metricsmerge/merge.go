package metricsmerge

import (
	dto "github.com/prometheus/client_model/go"
)

// familySet merges the families of several sources into one exposition in
// which every name has one family, so that the result parses: Istio
// concatenates the sources, and a family that both Envoy and the
// application expose (or one an exposition splits) gets two TYPE lines,
// which fails the whole scrape for strict parsers.
type familySet struct {
	order  []*mergedFamily
	byName map[string]*mergedFamily
}

type mergedFamily struct {
	*dto.MetricFamily
	// seen are the label sets present, built when a second part comes.
	seen map[string]bool
}

func newFamilySet(sizeHint int) *familySet {
	return &familySet{byName: make(map[string]*mergedFamily, sizeHint)}
}

// add merges one source's families in. A family whose type cannot be
// reconciled with the family of that name already present is left out and
// its name returned; a sample whose label set is already present is left
// out (the first source wins, as the agent's own metrics come first).
func (s *familySet) add(fams []*dto.MetricFamily) (conflicts []string) {
	for _, f := range fams {
		if len(f.GetMetric()) == 0 {
			continue
		}
		have, ok := s.byName[f.GetName()]
		if !ok {
			m := &mergedFamily{MetricFamily: f}
			s.byName[f.GetName()] = m
			s.order = append(s.order, m)
			continue
		}
		if !have.absorb(f) {
			conflicts = append(conflicts, f.GetName())
		}
	}
	return conflicts
}

// families is the merged result in the order names first came.
func (s *familySet) families() []*dto.MetricFamily {
	out := make([]*dto.MetricFamily, len(s.order))
	for i, m := range s.order {
		out[i] = m.MetricFamily
	}
	return out
}

// absorb adds f's samples to m. Untyped samples join a counter or gauge
// (Prometheus reads an untyped sample as a gauge-like value anyway); an
// untyped family takes the type of a typed part that comes later. Any
// other mix of types is refused.
func (m *mergedFamily) absorb(f *dto.MetricFamily) bool {
	mine, theirs := m.GetType(), f.GetType()
	switch {
	case mine == theirs:
	case mine == dto.MetricType_UNTYPED && isScalar(theirs):
		for _, metric := range m.Metric {
			retype(metric, theirs)
		}
		m.Type = theirs.Enum()
	case theirs == dto.MetricType_UNTYPED && isScalar(mine):
		for _, metric := range f.Metric {
			retype(metric, mine)
		}
	default:
		return false
	}
	if m.Help == nil {
		m.Help = f.Help
	}
	if m.seen == nil {
		m.seen = make(map[string]bool, len(m.Metric)+len(f.Metric))
		for _, metric := range m.Metric {
			m.seen[labelKey(metric.GetLabel())] = true
		}
	}
	for _, metric := range f.Metric {
		key := labelKey(metric.GetLabel())
		if m.seen[key] {
			continue
		}
		m.seen[key] = true
		m.Metric = append(m.Metric, metric)
	}
	return true
}

func isScalar(t dto.MetricType) bool {
	return t == dto.MetricType_COUNTER || t == dto.MetricType_GAUGE
}

// retype moves a scalar sample's value to the field of type t.
func retype(m *dto.Metric, t dto.MetricType) {
	var v *float64
	switch {
	case m.Untyped != nil:
		v = m.Untyped.Value
	case m.Counter != nil:
		v = m.Counter.Value
	case m.Gauge != nil:
		v = m.Gauge.Value
	}
	m.Untyped, m.Counter, m.Gauge = nil, nil, nil
	switch t {
	case dto.MetricType_COUNTER:
		m.Counter = &dto.Counter{Value: v}
	case dto.MetricType_GAUGE:
		m.Gauge = &dto.Gauge{Value: v}
	default:
		m.Untyped = &dto.Untyped{Value: v}
	}
}
