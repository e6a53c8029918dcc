package bootstrap

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/durationpb"
)

// The built-in bootstrap is built as JSON values in Envoy's proto-JSON form (the .proto's field
// names, enums by name, 64-bit integers as strings), as Istio's agent builds its own from a JSON
// template, rather than from go-control-plane's Go types. Marshalling those types makes
// protobuf-go build, and keep for the life of the process, its reflection and codec state for
// every type reachable from Bootstrap: 1.9 MB of heap that was never freed, 1.7 MiB of the idle
// agent's RSS and 2.9 MiB under DNS load (docs/performance.md, Memory). Tests parse every bootstrap this builds with Envoy's types,
// rejecting unknown fields, and run the types' validation rules on it, so a misspelt field, a
// wrong type URL or a bad value fails a test as it would have failed to compile.

// object is one JSON object of the bootstrap.
type object map[string]any

// set puts v under key unless it is nil or empty: an unset field, which proto JSON leaves out.
// An empty object is kept: for a message field, present and empty is not unset.
func (o object) set(key string, v any) {
	switch x := v.(type) {
	case nil:
		return
	case object:
		if x == nil {
			return
		}
	case []object:
		if len(x) == 0 {
			return
		}
	case []string:
		if len(x) == 0 {
			return
		}
	case string:
		if x == "" {
			return
		}
	case json.RawMessage:
		if x == nil {
			return
		}
	}
	o[key] = v
}

// typed is a google.protobuf.Any holding the message of the given full name, with its fields.
func typed(messageName string, fields object) object {
	out := object{"@type": "type.googleapis.com/" + messageName}
	for k, v := range fields {
		out[k] = v
	}
	return out
}

// duration is a google.protobuf.Duration in proto JSON ("0.250s"), by protojson itself.
func duration(d time.Duration) json.RawMessage {
	js, err := protojson.Marshal(durationpb.New(d))
	if err != nil {
		panic(fmt.Sprintf("envoy bootstrap: duration %v: %v", d, err)) // only for out-of-range durations
	}
	return js
}

// int64JSON is a 64-bit integer field's proto-JSON form: a string.
func int64JSON(n int64) string { return strconv.FormatInt(n, 10) }

// marshalBootstrap is the bootstrap file's text: indented JSON with a final newline. Map keys come
// out sorted, so the same inputs always give the same bytes; '<', '>' and '&' are left as they
// are (Envoy's formats and regexes may hold them).
func marshalBootstrap(b object) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(b); err != nil {
		return nil, fmt.Errorf("marshal bootstrap: %w", err)
	}
	return buf.Bytes(), nil
}
