package main

// `meshagent proxy-config log` (#35): istioctl's view of Envoy's log
// levels, through Envoy's admin POST /logging.

import (
	"cmp"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/meshagent/meshagent/cmd/meshagent/internal/boundedhttp"
)

// envoyLogLevels are istioctl's level names (proxyconfig.go stringToLevel),
// each as Envoy's admin takes it.
var envoyLogLevels = map[string]string{"trace": "trace", "debug": "debug", "info": "info", "warning": "warning",
	"warn": "warning", "error": "error", "critical": "critical", "off": "off"}

// newLogView is istioctl's `proxy-config log`: Envoy's loggers and their
// levels, set with --level (LEVEL for all, or LOGGER:LEVEL,...) or reset
// with --reset, each a POST /logging to Envoy's admin, as istioctl does.
// Reset restores the levels Envoy was started with (its /server_info's
// log_level and component_log_level: the agent's --proxyLogLevel and
// --proxyComponentLogLevel), where istioctl takes the mesh's injector
// default, which the pod has no access to.
func newLogView(common *proxyConfigFlags) *cobra.Command {
	var level string
	var reset bool
	c := &cobra.Command{
		Use: "log", Aliases: []string{"o"}, Args: cobra.NoArgs,
		Short: "Envoy's log levels; --level to set them, --reset to go back to those Envoy started with",
		Example: "  meshagent proxy-config log\n  meshagent proxy-config log --level debug\n" +
			"  meshagent proxy-config log --level http:debug,router:trace\n  meshagent proxy-config log --reset",
		RunE: func(cmd *cobra.Command, _ []string) error {
			if reset && level != "" {
				return usageError("proxy-config log: --level cannot be combined with --reset")
			}
			if common.output != "short" {
				return usageError("proxy-config log: -o %q: --output is not applicable for this command", common.output)
			}
			var queries []string
			var err error
			switch {
			case reset:
				queries, err = startLogLevels(common.admin)
			case level != "":
				queries, err = logLevelQueries(level)
			}
			if err != nil {
				return err
			}
			if len(queries) == 0 {
				queries = []string{""}
			}
			var last []byte
			for _, q := range queries {
				if last, err = postLogging(common.admin, q); err != nil {
					return err
				}
			}
			_, err = cmd.OutOrStdout().Write(last)
			return err
		},
	}
	c.Flags().StringVar(&level, "level", "", "LEVEL for every logger, or LOGGER:LEVEL,... (levels: trace, debug, info, warning, error, critical, off)")
	c.Flags().BoolVarP(&reset, "reset", "r", false, "set the levels Envoy was started with")
	return c
}

// logLevelQueries are the POST /logging queries of a --level value, in
// istioctl's order: the level of all loggers first, then each named one.
func logLevelQueries(value string) ([]string, error) {
	var all string
	var named []string
	for part := range strings.SplitSeq(value, ",") {
		// A logger may be given with its namespace (istioctl: a::b:level).
		if i := strings.LastIndex(part, "::"); i >= 0 {
			part = part[i+2:]
		}
		name, lvl := "", part
		if i := strings.IndexAny(part, ":="); i >= 0 {
			name, lvl = part[:i], part[i+1:]
		}
		envoyLevel, ok := envoyLogLevels[strings.TrimSpace(lvl)]
		if !ok {
			return nil, usageError("proxy-config log: --level %q: unrecognized logging level %q (want trace, debug, info, warning, error, critical or off)", value, lvl)
		}
		if name == "" || name == "level" {
			all = "level=" + envoyLevel
			continue
		}
		named = append(named, name+"="+envoyLevel)
	}
	if all != "" {
		return append([]string{all}, named...), nil
	}
	return named, nil
}

// startLogLevels are the queries that restore the levels of Envoy's
// command line, read from its /server_info.
func startLogLevels(admin string) ([]string, error) {
	url := "http://" + admin + "/server_info"
	resp, body, err := getLocal(url, 4<<20, "Envoy running, with its admin API at "+admin)
	if err != nil {
		return nil, fmt.Errorf("proxy-config log --reset: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("proxy-config log --reset: GET %s: %s", url, resp.Status)
	}
	var info struct {
		Options struct {
			LogLevel          string `json:"log_level"`
			ComponentLogLevel string `json:"component_log_level"`
		} `json:"command_line_options"`
	}
	if err := json.Unmarshal(body, &info); err != nil {
		return nil, fmt.Errorf("proxy-config log --reset: %s: %w", url, err)
	}
	level := cmp.Or(info.Options.LogLevel, "warning") // istioctl's default when it knows none
	queries, err := logLevelQueries(level)
	if err != nil {
		return nil, err
	}
	if c := info.Options.ComponentLogLevel; c != "" {
		more, err := logLevelQueries(c)
		if err != nil {
			return nil, err
		}
		queries = append(queries, more...)
	}
	return queries, nil
}

// postLogging is POST /logging?query at Envoy's admin: its answer, the
// loggers and their levels; an error with Envoy's own when it refuses. It
// goes through the CLI's one bounded client and reader (#33), as getLocal
// does: an answer past maxLoggingAnswer is an error naming the bound, not
// a silently cut list.
func postLogging(admin, query string) ([]byte, error) {
	url := "http://" + admin + "/logging"
	if query != "" {
		url += "?" + query
	}
	resp, err := boundedhttp.Client(10*time.Second).Post(url, "", nil)
	if err != nil {
		return nil, fmt.Errorf("proxy-config log: %w (is Envoy running, with its admin API at %s?)", err, admin)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		first, _, _ := strings.Cut(boundedhttp.Excerpt(resp.Body), "\n")
		return nil, fmt.Errorf("proxy-config log: Envoy refused %s: %s (%s)", query, first, resp.Status)
	}
	body, err := boundedhttp.Read(resp.Body, maxLoggingAnswer)
	if err != nil {
		return nil, fmt.Errorf("proxy-config log: reading %s: %w", url, err)
	}
	return body, nil
}

// maxLoggingAnswer bounds Envoy's list of loggers: about 100 lines of a
// few dozen bytes in Envoy 1.3x.
const maxLoggingAnswer = 1 << 20
