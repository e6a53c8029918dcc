package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
)

// The record knob, for the differential conformance suite
// (cmd/meshagent/conformance): FAKE_ENVOY_RECORD=DIR writes the
// command line the agent gave Envoy (DIR/args.json, without the binary) and
// the bootstrap file it names (DIR/bootstrap.json or .yaml, as read) before
// anything is checked, so that even a bootstrap Envoy would refuse is
// recorded. The agent may delete the file when Envoy exits (Istio's does):
// this copy is what it wrote. FAKE_ENVOY_RECORD_EXIT=N then exits with N at
// once; unset, the stand-in runs on as usual.

// record writes args and the bootstrap into dir; the files appear whole
// (written aside, renamed), args.json last, so a reader polling for it sees
// both.
func record(dir string, args []string, configPath string) error {
	if configPath != "" {
		data, err := os.ReadFile(configPath)
		if err != nil {
			return fmt.Errorf("FAKE_ENVOY_RECORD: read bootstrap: %w", err)
		}
		name := "bootstrap.json"
		if ext := filepath.Ext(configPath); ext == ".yaml" || ext == ".yml" {
			name = "bootstrap.yaml"
		}
		if err := writeWhole(filepath.Join(dir, name), data); err != nil {
			return err
		}
	}
	js, err := json.MarshalIndent(args, "", "  ")
	if err != nil {
		return err
	}
	return writeWhole(filepath.Join(dir, "args.json"), append(js, '\n'))
}

func writeWhole(path string, data []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o666); err != nil {
		return fmt.Errorf("FAKE_ENVOY_RECORD: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("FAKE_ENVOY_RECORD: %w", err)
	}
	return nil
}

// recordKnob reads FAKE_ENVOY_RECORD and FAKE_ENVOY_RECORD_EXIT: the
// directory ("" when not recording) and the exit code (-1: run on).
func recordKnob() (dir string, exit int, err error) {
	dir, exit = os.Getenv("FAKE_ENVOY_RECORD"), -1
	if v := os.Getenv("FAKE_ENVOY_RECORD_EXIT"); v != "" {
		if exit, err = strconv.Atoi(v); err != nil || exit < 0 {
			return "", 0, fmt.Errorf("FAKE_ENVOY_RECORD_EXIT=%q: want an exit code", v)
		}
	}
	return dir, exit, nil
}
