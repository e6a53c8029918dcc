package main

// POST /logging as Envoy's admin answers it (source/server/admin/
// logs_handler.cc), for `meshagent proxy-config log` (#35): no parameter
// lists the loggers; ?level=L sets them all; ?<logger>=L sets one;
// ?paths=a:L,b:L sets several; a bad level or logger is a 404 with Envoy's
// usage text; the answer always ends with the active loggers. A GET is
// refused as Envoy refuses it: the endpoint changes state.

import (
	"cmp"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
)

// envoyLoggers are some of Envoy's logger names (Logger::Registry), the
// ones an operator reaches for.
var envoyLoggers = []string{"admin", "config", "connection", "dns", "filter", "grpc", "http", "http2", "main", "misc",
	"pool", "rbac", "router", "runtime", "secret", "upstream", "wasm"}

// envoyLevels are spdlog's level names, as Envoy prints and accepts them.
var envoyLevels = []string{"trace", "debug", "info", "warning", "error", "critical", "off"}

// loggerLevels are the loggers' levels at start: --log-level for all, then
// --component-log-level's name:level pairs (Envoy's default: info).
func loggerLevels(o *options) map[string]string {
	all, components := "info", ""
	if o != nil {
		all, components = cmp.Or(o.logLevel, all), o.componentLogLevel
	}
	if all == "warn" {
		all = "warning"
	}
	levels := make(map[string]string, len(envoyLoggers))
	for _, l := range envoyLoggers {
		levels[l] = all
	}
	for pair := range strings.SplitSeq(components, ",") {
		if name, level, ok := strings.Cut(pair, ":"); ok && levels[name] != "" {
			levels[name] = level
		}
	}
	return levels
}

func (e *envoy) handleLogging(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		http.Error(w, fmt.Sprintf("Method %s not allowed, POST required.", r.Method), http.StatusMethodNotAllowed)
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.loggers == nil {
		e.loggers = loggerLevels(e.opts)
	}
	w.Header().Set("Content-Type", "text/plain; charset=UTF-8")
	if err := e.changeLogLevels(r.URL.Query()); err != nil {
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprintf(w, "error: %v\n\n", err)
		fmt.Fprint(w, "usage: /logging?<name>=<level> (change single level)\n"+
			"usage: /logging?paths=name1:level1,name2:level2,... (change multiple levels)\n"+
			"usage: /logging?level=<level> (change all levels)\nlevels: ")
		for _, l := range envoyLevels {
			fmt.Fprintf(w, "%s ", l)
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintln(w, "active loggers:")
	for _, name := range slices.Sorted(maps.Keys(e.loggers)) {
		fmt.Fprintf(w, "  %s: %s\n", name, e.loggers[name])
	}
	fmt.Fprintln(w)
}

// changeLogLevels is Envoy's LogsHandler::changeLogLevel: all or nothing.
func (e *envoy) changeLogLevels(q map[string][]string) error {
	for _, k := range []string{"level", "paths"} {
		if v, ok := q[k]; ok && (len(v) == 0 || v[0] == "") {
			delete(q, k)
		}
	}
	if len(q) == 0 {
		return nil
	}
	if len(q) != 1 {
		return fmt.Errorf("invalid number of parameters")
	}
	valid := func(level string) bool { return slices.Contains(envoyLevels, level) }
	if level, ok := q["level"]; ok {
		if !valid(level[0]) {
			return fmt.Errorf("unknown logger level")
		}
		for name := range e.loggers {
			e.loggers[name] = level[0]
		}
		return nil
	}
	set := map[string]string{}
	if paths, ok := q["paths"]; ok {
		for pair := range strings.SplitSeq(paths[0], ",") {
			name, level, ok := strings.Cut(pair, ":")
			if !ok {
				return fmt.Errorf("error parsing paths")
			}
			set[name] = level
		}
	} else {
		for name, v := range q {
			set[name] = v[0]
		}
	}
	for name, level := range set {
		if !valid(level) {
			return fmt.Errorf("unknown logger level")
		}
		if _, ok := e.loggers[name]; !ok {
			return fmt.Errorf("unknown logger name")
		}
	}
	maps.Copy(e.loggers, set)
	return nil
}
