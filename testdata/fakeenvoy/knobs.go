package main

import (
	"fmt"
	"os"
	"strconv"
	"time"
)

// knobs are the environment variables that make the fake misbehave.
type knobs struct {
	crashAfter    time.Duration // FAKE_ENVOY_CRASH_AFTER: exit with exitCode after this
	exitCode      int           // FAKE_ENVOY_EXIT_CODE: default 1
	neverReady    bool          // FAKE_ENVOY_NEVER_READY=1: /ready stays PRE_INITIALIZING
	readyAfter    time.Duration // FAKE_ENVOY_READY_AFTER: /ready turns LIVE after this
	ignoreSIGTERM bool          // FAKE_ENVOY_IGNORE_SIGTERM=1: only SIGKILL ends it
	// FAKE_ENVOY_ACTIVE_CONNECTIONS: downstream_cx_active reported on a
	// business listener (0.0.0.0_15006); after a drain request it counts
	// down to 0 over FAKE_ENVOY_DRAIN_SECONDS (default 1).
	activeConnections int
	drainTime         time.Duration
	// reject: FAKE_ENVOY_REJECT=cds,lds,eds,rds NACKs every response of
	// those types (as Envoy rejects a config it cannot load).
	reject map[string]bool
	// rejectName: FAKE_ENVOY_REJECT_NAME=S NACKs a response holding a
	// resource whose name contains S, naming it (as Envoy names the
	// cluster or listener it could not load), and accepts the others.
	rejectName string
	// exitAtStart: FAKE_ENVOY_EXIT_AT_START=1 exits with exitCode right
	// after the hot restart sockets and shared memory are taken, where
	// Envoy fails on a bootstrap it cannot load (#25): before it has
	// asked anything of its parent, with its INITIALIZING flag left set.
	exitAtStart bool
	// hotRestartRetryDelay: FAKE_ENVOY_HOT_RESTART_RETRY_DELAY, the pause
	// between refused sends to a parent (Envoy's: 1s, 10 tries).
	hotRestartRetryDelay time.Duration
	// statsPeers: FAKE_ENVOY_STATS_PEERS, the peers /stats/prometheus has
	// Istio's request families for (a sidecar with traffic; default 1).
	statsPeers int
}

func readKnobs() (knobs, error) {
	k := knobs{exitCode: 1, drainTime: time.Second, activeConnections: -1, hotRestartRetryDelay: time.Second}
	var err error
	dur := func(name string, dst *time.Duration) {
		if v := os.Getenv(name); v != "" && err == nil {
			if *dst, err = time.ParseDuration(v); err != nil {
				err = fmt.Errorf("%s=%q: %w", name, v, err)
			}
		}
	}
	num := func(name string, dst *int) {
		if v := os.Getenv(name); v != "" && err == nil {
			if *dst, err = strconv.Atoi(v); err != nil {
				err = fmt.Errorf("%s=%q: %w", name, v, err)
			}
		}
	}
	dur("FAKE_ENVOY_CRASH_AFTER", &k.crashAfter)
	dur("FAKE_ENVOY_READY_AFTER", &k.readyAfter)
	dur("FAKE_ENVOY_HOT_RESTART_RETRY_DELAY", &k.hotRestartRetryDelay)
	num("FAKE_ENVOY_EXIT_CODE", &k.exitCode)
	num("FAKE_ENVOY_ACTIVE_CONNECTIONS", &k.activeConnections)
	num("FAKE_ENVOY_STATS_PEERS", &k.statsPeers)
	if v := os.Getenv("FAKE_ENVOY_DRAIN_SECONDS"); v != "" && err == nil {
		var f float64
		if f, err = strconv.ParseFloat(v, 64); err != nil {
			err = fmt.Errorf("FAKE_ENVOY_DRAIN_SECONDS=%q: %w", v, err)
		}
		k.drainTime = time.Duration(f * float64(time.Second))
	}
	if err == nil {
		k.reject, err = parseReject(os.Getenv("FAKE_ENVOY_REJECT"))
	}
	k.rejectName = os.Getenv("FAKE_ENVOY_REJECT_NAME")
	k.neverReady = os.Getenv("FAKE_ENVOY_NEVER_READY") == "1"
	k.ignoreSIGTERM = os.Getenv("FAKE_ENVOY_IGNORE_SIGTERM") == "1"
	k.exitAtStart = os.Getenv("FAKE_ENVOY_EXIT_AT_START") == "1"
	return k, err
}
