package main

import (
	"math/rand/v2"
	"net/http"
	"sort"
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// Envoy's layered runtime, as far as the agent relies on it (#36): the
// bootstrap's static layers, and the admin layer that POST /runtime_modify
// writes, each a layer over the one before; a route that matches on a
// runtime_fraction reads it. Envoy refuses /runtime_modify when the
// bootstrap names no admin layer, and takes only POST.

// hasAdminLayer says whether the bootstrap's layered runtime has an admin
// layer.
func (e *envoy) hasAdminLayer() bool {
	for _, l := range e.boot.GetLayeredRuntime().GetLayers() {
		if l.GetAdminLayer() != nil {
			return true
		}
	}
	return false
}

// handleRuntimeModify is POST /runtime_modify?key=value&...: each key set
// in the admin layer ("" removes it, as Envoy does).
func (e *envoy) handleRuntimeModify(w http.ResponseWriter, r *http.Request) {
	if !e.hasAdminLayer() {
		http.Error(w, "No admin layer specified", http.StatusServiceUnavailable)
		return
	}
	q := r.URL.Query()
	if len(q) == 0 {
		http.Error(w, "usage: /runtime_modify?key1=value1&key2=value2&keyN=valueN", http.StatusBadRequest)
		return
	}
	e.mu.Lock()
	for k, vs := range q {
		v := vs[len(vs)-1]
		if v == "" {
			delete(e.runtime, k)
			continue
		}
		e.runtime[k] = v
	}
	e.mu.Unlock()
	w.Write([]byte("OK\n"))
}

// handleRuntime is GET /runtime: every key's final value (Envoy also lists
// each layer's value; the agent reads none of it).
func (e *envoy) handleRuntime(w http.ResponseWriter, _ *http.Request) {
	type entry struct {
		FinalValue string `json:"final_value"`
	}
	entries := map[string]entry{}
	for _, k := range e.runtimeKeys() {
		v, _ := e.runtimeValue(k)
		entries[k] = entry{v}
	}
	writeJSON(w, map[string]any{"entries": entries})
}

// runtimeKeys are the keys of every layer, sorted.
func (e *envoy) runtimeKeys() []string {
	seen := map[string]bool{}
	for _, l := range e.boot.GetLayeredRuntime().GetLayers() {
		for k := range l.GetStaticLayer().GetFields() {
			seen[k] = true
		}
	}
	e.mu.Lock()
	for k := range e.runtime {
		seen[k] = true
	}
	e.mu.Unlock()
	keys := make([]string, 0, len(seen))
	for k := range seen {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// runtimeValue is key's value in the top layer that has it: the admin
// layer, then the static layers from the last.
func (e *envoy) runtimeValue(key string) (string, bool) {
	e.mu.Lock()
	v, ok := e.runtime[key]
	e.mu.Unlock()
	if ok {
		return v, true
	}
	layers := e.boot.GetLayeredRuntime().GetLayers()
	for i := len(layers) - 1; i >= 0; i-- {
		f, ok := layers[i].GetStaticLayer().GetFields()[key]
		if !ok {
			continue
		}
		switch k := f.GetKind().(type) {
		case *structpb.Value_NumberValue:
			return strconv.FormatFloat(k.NumberValue, 'f', -1, 64), true
		case *structpb.Value_BoolValue:
			return strconv.FormatBool(k.BoolValue), true
		}
		return f.GetStringValue(), true
	}
	return "", false
}

// fractionEnabled is Envoy's featureEnabled for a runtime_fraction: the
// key's value read as an integral percentage ("42" is 42 of HUNDRED, as
// RuntimeFractionalPercent documents), else the default, drawn against a
// random value per request.
func (e *envoy) fractionEnabled(f *corev3.RuntimeFractionalPercent) bool {
	percent := f.GetDefaultValue()
	numerator, denominator := uint64(percent.GetNumerator()), denominatorOf(percent.GetDenominator())
	if v, ok := e.runtimeValue(f.GetRuntimeKey()); ok {
		if n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64); err == nil {
			numerator, denominator = n, 100
		}
	}
	return rand.Uint64N(denominator) < numerator
}

func denominatorOf(d typev3.FractionalPercent_DenominatorType) uint64 {
	switch d {
	case typev3.FractionalPercent_TEN_THOUSAND:
		return 10_000
	case typev3.FractionalPercent_MILLION:
		return 1_000_000
	}
	return 100
}
