package main

import (
	"encoding/json"
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"
)

// buildVersion is set by the linker: `make build` passes
// -ldflags "-X main.buildVersion=$(git describe --tags --always --dirty)".
// It is the agent's version and the bootstrap's ISTIO_VERSION metadata.
// Without it, a `go build` in a git checkout still carries the module
// version Go stamps from the VCS; only test binaries say "dev".
var buildVersion = "dev"

// buildRevision is the commit, also set by `make build` (-X
// main.buildRevision=...), for builds without Go's VCS stamping.
var buildRevision = ""

type versionInfo struct {
	Version     string `json:"version"`
	GitRevision string `json:"revision"`
	GoVersion   string `json:"golang_version"`
	BuildStatus string `json:"status"`
}

func currentVersion() versionInfo {
	v := versionInfo{Version: buildVersion, GitRevision: buildRevision, GoVersion: runtime.Version(), BuildStatus: "Clean"}
	if strings.HasSuffix(v.Version, "-dirty") {
		v.BuildStatus = "Modified"
	}
	if info, ok := debug.ReadBuildInfo(); ok {
		if v.Version == "dev" && info.Main.Version != "" && info.Main.Version != "(devel)" {
			v.Version = info.Main.Version
		}
		for _, s := range info.Settings {
			switch s.Key {
			case "vcs.revision":
				v.GitRevision = s.Value
			case "vcs.modified":
				if s.Value == "true" {
					v.BuildStatus = "Modified"
				}
			}
		}
	}
	return v
}

func newVersionCommand() *cobra.Command {
	var short bool
	var output string
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Prints out build version information",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			v := currentVersion()
			out := cmd.OutOrStdout()
			switch output {
			case "":
				if short {
					fmt.Fprintln(out, v.Version)
					return nil
				}
				fmt.Fprintf(out, "version.BuildInfo{Version:%q, GitRevision:%q, GolangVersion:%q, BuildStatus:%q}\n",
					v.Version, v.GitRevision, v.GoVersion, v.BuildStatus)
			case "json":
				b, _ := json.MarshalIndent(map[string]versionInfo{"clientVersion": v}, "", "  ")
				fmt.Fprintln(out, string(b))
			case "yaml":
				b, _ := yaml.Marshal(map[string]versionInfo{"clientVersion": v})
				fmt.Fprint(out, string(b))
			default:
				return usageError("version: --output must be 'yaml' or 'json', not %q", output)
			}
			return nil
		},
	}
	cmd.Flags().BoolVarP(&short, "short", "s", false, "Use --short=false to generate full version information")
	cmd.Flags().StringVarP(&output, "output", "o", "", "One of 'yaml' or 'json'.")
	return cmd
}
