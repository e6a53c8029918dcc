package main

import (
	"encoding/json"
	"fmt"
	"log"
	"net/http"
	"regexp"
	"sort"
	"strconv"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

type jsonRaw = json.RawMessage

// adminMux is Envoy's admin API, as much as the agent and the tests use.
func (e *envoy) adminMux(exit chan<- int) *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /ready", func(w http.ResponseWriter, _ *http.Request) {
		st := e.serverState()
		if st != stateLive {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		fmt.Fprintln(w, stateNames[st])
	})
	mux.HandleFunc("GET /server_info", func(w http.ResponseWriter, _ *http.Request) {
		hrVersion := hotRestartVersion
		if e.hr == nil {
			hrVersion = "disabled"
		}
		o := e.opts
		writeJSON(w, map[string]any{
			"version":             "fakeenvoy/0.0.0/Clean/RELEASE/BoringSSL",
			"state":               stateNames[e.serverState()],
			"hot_restart_version": hrVersion,
			// Envoy's CommandLineOptions, as much as hot restart uses
			// (base_id is a uint64: a string in JSON).
			"command_line_options": map[string]any{
				"base_id":              strconv.Itoa(o.baseID),
				"restart_epoch":        o.restartEpoch,
				"disable_hot_restart":  o.disableHotRestart,
				"drain_time":           fmt.Sprintf("%ds", o.drainTimeS),
				"parent_shutdown_time": fmt.Sprintf("%ds", o.parentShutdownTimeS),
				"socket_path":          o.socketPath,
				"socket_mode":          o.socketMode,
				"mode":                 "Serve",
				"config_path":          o.configPath,
				"concurrency":          o.concurrency,
				"log_level":            o.logLevel,
				"component_log_level":  o.componentLogLevel,
			},
			"uptime_current_epoch": fmt.Sprintf("%ds", int(time.Since(e.started).Seconds())),
			"uptime_all_epochs":    fmt.Sprintf("%ds", int(time.Since(e.firstStarted).Seconds())),
			"node":                 jsonRaw(mustProtoJSON(e.boot.GetNode())),
		})
	})
	mux.HandleFunc("GET /stats", e.handleStats)
	mux.HandleFunc("GET /stats/prometheus", e.handlePrometheus)
	mux.HandleFunc("POST /drain_listeners", func(w http.ResponseWriter, r *http.Request) {
		e.mu.Lock()
		e.drains = append(e.drains, r.URL.RawQuery)
		if e.drainStarted.IsZero() {
			e.drainStarted = time.Now()
		}
		e.mu.Unlock()
		log.Printf("drain_listeners?%s", r.URL.RawQuery)
		fmt.Fprintln(w, "OK")
	})
	mux.HandleFunc("GET /fake/drains", func(w http.ResponseWriter, _ *http.Request) {
		e.mu.Lock()
		defer e.mu.Unlock()
		writeJSON(w, append([]string{}, e.drains...))
	})
	mux.HandleFunc("POST /healthcheck/fail", func(w http.ResponseWriter, _ *http.Request) {
		e.mu.Lock()
		e.healthFailed = true
		e.mu.Unlock()
		fmt.Fprintln(w, "OK")
	})
	mux.HandleFunc("POST /healthcheck/ok", func(w http.ResponseWriter, _ *http.Request) {
		e.mu.Lock()
		e.healthFailed = false
		e.mu.Unlock()
		fmt.Fprintln(w, "OK")
	})
	mux.HandleFunc("POST /runtime_modify", e.handleRuntimeModify)
	mux.HandleFunc("GET /runtime", e.handleRuntime)
	mux.HandleFunc("POST /quitquitquit", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "OK")
		select {
		case exit <- 0:
		default:
		}
	})
	mux.HandleFunc("GET /config_dump", e.handleConfigDump)
	mux.HandleFunc("/logging", e.handleLogging)
	mux.HandleFunc("GET /listeners", e.handleListeners)
	mux.HandleFunc("GET /clusters", e.handleClusters)
	return mux
}

// allStats is every stat the fake reports, by Envoy name. usedOnly leaves
// out what was never written, as Envoy's /stats?usedonly.
func (e *envoy) allStats(usedOnly bool) map[string]int {
	e.mu.Lock()
	out := make(map[string]int, len(e.stats)+8)
	for name, n := range e.stats {
		out[name] = n
	}
	out["server.state"] = e.serverStateLocked()
	if !usedOnly {
		for _, name := range []string{"cluster_manager.cds.update_success", "cluster_manager.cds.update_rejected",
			"listener_manager.lds.update_success", "listener_manager.lds.update_rejected", "listener_manager.workers_started"} {
			out[name] += 0
		}
	}
	for name, n := range e.active {
		out["listener."+name+".downstream_cx_active"] = n
		out["http."+name+".downstream_cx_active"] = n
	}
	e.mu.Unlock()
	if n := e.businessConnections(); n >= 0 {
		// What a sidecar's inbound listener reports, with the per-worker
		// and http. duplicates, none of which may be counted twice by the
		// agent; and the HBONE internal listeners of an ambient gateway or
		// waypoint (the names of Istio's agent_test.go), whose pipe
		// connections last as long as the tunnel pool, through a drain:
		// Istio 1.30.3 leaves them out of the count (#35).
		out["listener.0.0.0.0_15006.downstream_cx_active"] = n
		out["listener.0.0.0.0_15006.worker_0.downstream_cx_active"] = n
		out["http.inbound_0.0.0.0_15006.downstream_cx_active"] = n
		for name, held := range map[string]int{"connect_originate": 7, "connect_terminate": 4, "main_internal": 3,
			"inner_connect_originate": 1, "outer_connect_originate": 1} {
			out["listener.envoy_internal_"+name+".downstream_cx_active"] = held
			out["listener.envoy_internal_"+name+".worker_0.downstream_cx_active"] = held
		}
	}
	return out
}

// handleStats serves /stats text: "name: value" lines, sorted, filtered by
// the filter regex.
func (e *envoy) handleStats(w http.ResponseWriter, r *http.Request) {
	var filter *regexp.Regexp
	if f := r.URL.Query().Get("filter"); f != "" {
		var err error
		if filter, err = regexp.Compile(f); err != nil {
			http.Error(w, "Invalid re2 regex", http.StatusBadRequest)
			return
		}
	}
	if r.URL.Query().Get("format") == "prometheus" {
		e.handlePrometheus(w, r)
		return
	}
	_, usedOnly := r.URL.Query()["usedonly"]
	stats := e.allStats(usedOnly)
	names := make([]string, 0, len(stats))
	for n := range stats {
		if filter == nil || filter.MatchString(n) {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	if r.URL.Query().Get("format") == "json" {
		// Envoy's /stats?format=json: {"stats": [{"name", "value"}, ...]}
		// (#35); the stand-in has no histograms.
		type stat struct {
			Name  string `json:"name"`
			Value int    `json:"value"`
		}
		out := struct {
			Stats []stat `json:"stats"`
		}{Stats: []stat{}}
		for _, n := range names {
			out.Stats = append(out.Stats, stat{n, stats[n]})
		}
		writeJSON(w, out)
		return
	}
	for _, n := range names {
		fmt.Fprintf(w, "%s: %d\n", n, stats[n])
	}
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		log.Printf("write json: %v", err)
	}
}

// mustProtoJSON is m as Envoy's admin writes a message: proto field names
// (/server_info's node: user_agent_name, not userAgentName) (#35).
func mustProtoJSON(m proto.Message) []byte {
	raw, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(m)
	if err != nil || len(raw) == 0 {
		return []byte("{}")
	}
	return raw
}
