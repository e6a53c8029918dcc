package metricsmerge

import (
	"bytes"
	"errors"
	"io"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/textparse"
)

// scanExposition reads a text (0.0.4) exposition without building its
// samples: it checks the syntax and lists the family names, and says
// whether the body is clean, that is whether strict parsers (expfmt,
// promtool) read it as it is: each family in one piece with its TYPE and
// HELP lines before its samples, and each at most once. A clean body whose
// families no other source has can be passed on byte for byte, which is
// what makes a merged scrape cost about what Istio's concatenation costs;
// anything else is parsed and merged family by family.
func scanExposition(body []byte) (names []string, clean bool, err error) {
	p := textparse.NewPromParser(body, nil, false)
	seen := map[string]bool{}   // families that have been open
	helped := map[string]bool{} // names with a HELP line
	var block string            // the family of the last TYPE line
	var typ model.MetricType    // its type
	var current string          // the family of the last sample
	clean = true
	// open notes a sample of the family name; it allocates the name only
	// when another family begins.
	open := func(name []byte) {
		if string(name) == current {
			return
		}
		if seen[string(name)] {
			clean = false // split, or a TYPE line after its samples
		}
		current = string(name)
		seen[current] = true
		names = append(names, current)
	}
	for {
		entry, err := p.Next()
		if errors.Is(err, io.EOF) {
			return names, clean, nil
		}
		if err != nil {
			return nil, false, err
		}
		switch entry {
		case textparse.EntryHelp:
			name, _ := p.Help()
			if helped[string(name)] || (seen[string(name)] && string(name) != current) {
				clean = false
			}
			helped[string(name)] = true
		case textparse.EntryType:
			name, t := p.Type()
			block, typ = string(name), t
			if seen[block] {
				clean = false
			}
		case textparse.EntrySeries:
			series, _, _ := p.Series()
			name := series
			if i := bytes.IndexAny(series, "{ \t"); i >= 0 {
				name = series[:i]
			}
			if len(name) == 0 {
				clean = false // a quoted UTF-8 name inside the braces
			}
			// The sample is the block's if its name is the block's name
			// and a suffix of its type (roleInBlock, without a copy).
			if block != "" && len(name) >= len(block) && string(name[:len(block)]) == block &&
				roleOfSuffix(typ, string(name[len(block):])) != notInBlock {
				open(name[:len(block)])
			} else {
				open(name)
			}
		}
	}
}
