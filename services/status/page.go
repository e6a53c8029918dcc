package status

import (
	_ "embed"
	"html/template"
	"maps"
	"net/http"
	"slices"
	"strings"
	"time"
)

// The status page, GET /debug/ (issue 22): for the operator who
// port-forwards 15020 and opens a browser. One server-rendered page, no
// script and no external asset (a pod has no CDN, and the page must work
// during the outage it is opened for), refreshing itself every 5 s: the
// tree with states and restarts, the xDS verdicts, the certificate's time
// left and the DNS table. Everything on it is also on the JSON endpoints.

//go:embed page.html
var pageHTML string

var pageTemplate = template.Must(template.New("page").Parse(pageHTML))

// pageData is what page.html renders.
type pageData struct {
	Ready    bool
	Reason   string
	Now      string
	Services []pageService
	XDS      *XDSReport
	Types    []pageType
	XDSSince string
	// Verdict is the worst of the types' verdicts, for the summary line.
	Verdict  string
	Cert     *CertReport
	CertLeft string
	Names    *NamesReport
}

type pageService struct {
	Indent                   int
	Name, State, Since, Note string
	Restarts, Panics         int
	Class                    string // ok, warn or bad
}

type pageType struct {
	Short, Verdict, Sent, ACKed, Error string
	Resources, NACKs                   int
}

func (s *Service) handlePage(w http.ResponseWriter, _ *http.Request) {
	t, _ := s.in.Tree.Get()
	v := s.view.Load()
	now := s.clock.Now()
	d := pageData{Ready: v.ready, Reason: v.reason, Now: now.UTC().Format(time.RFC3339),
		XDS: s.xdsReport().json(), Cert: s.certReport(), Names: s.namesReport()}
	for _, n := range t.Services {
		state := displayState(n, v)
		d.Services = append(d.Services, pageService{Indent: strings.Count(n.Path, "/"), Name: n.Name, State: state,
			Since: n.Since.UTC().Format(time.RFC3339), Note: oneLine(serviceNote(n, v)), Restarts: n.Restarts, Panics: n.Panics,
			Class: stateClass(state)})
	}
	if d.XDS != nil {
		if d.XDS.Since != nil {
			d.XDSSince = d.XDS.Since.UTC().Format(time.RFC3339)
		}
		for _, typeURL := range slices.Sorted(maps.Keys(d.XDS.Types)) {
			x := d.XDS.Types[typeURL]
			pt := pageType{Short: x.Short, Verdict: x.Verdict, Sent: x.SentVersion, ACKed: x.ACKedVersion,
				Resources: x.SentResources, NACKs: x.NACKs}
			if x.NACK != nil {
				pt.Error = x.NACK.Error
			}
			d.Types = append(d.Types, pt)
			if verdictRank(pt.Verdict) > verdictRank(d.Verdict) {
				d.Verdict = pt.Verdict
			}
		}
	}
	if c := d.Cert; c != nil && c.Reported && c.Error == "" {
		d.CertLeft = (time.Duration(c.RemainingSeconds) * time.Second).String()
		if c.RemainingSeconds < 0 {
			d.CertLeft = "EXPIRED"
		}
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	if err := pageTemplate.Execute(w, d); err != nil {
		s.log.Warn("status page", "error", err)
	}
}

// stateClass colours a state: ready or running green, degraded amber,
// anything else (starting, failed, stopped) red.
func stateClass(state string) string {
	switch {
	case strings.HasPrefix(state, "ready"), state == "running":
		return "ok"
	case strings.HasPrefix(state, "degraded"):
		return "warn"
	}
	return "bad"
}

// verdictRank orders the verdicts from best to worst.
func verdictRank(v string) int {
	return slices.Index([]string{"", "SYNCED", "STALE", "SERVING CACHE", "NACKED"}, v)
}
