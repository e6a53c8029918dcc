package main

import (
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/meshagent/meshagent/image"
)

// newImageCommand is `meshagent image`: the sidecar image a user runs,
// meshagent layered onto their own Istio release's proxyv2, built by the
// agent's own binary with no container daemon (#32; package image).
func newImageCommand(cli *cliContext) *cobra.Command {
	var o image.Options
	var agents, labels []string
	cmd := &cobra.Command{
		Use:   "image --base REF (--push REF | -o FILE) [--platform OS/ARCH,...] [--agent OS/ARCH=PATH]...",
		Short: "Builds the sidecar image: meshagent layered onto Istio's proxyv2, pushed or written (no container daemon)",
		Long: `Builds the sidecar image: Istio's own proxyv2 image (its Envoy, user, command,
environment and labels kept) with one layer added that installs this meshagent as
/usr/local/bin/pilot-agent and its init (meshagent-init) beside it. Istio's entrypoint
(/usr/local/bin/pilot-agent) becomes the init in front of the agent, so that a pod
starts the agent once; a base with another entrypoint keeps it.

The base is pulled with the credentials docker's config.json holds (docker login),
or read from a docker-archive tarball (--base tarball:PATH, or an existing file) or
an OCI image layout (--base oci:DIR, or an existing directory). It must have Envoy
(/usr/local/bin/envoy), Istio's agent (/usr/local/bin/pilot-agent), Istio's
bootstrap template (/var/lib/istio/envoy/envoy_bootstrap_tmpl.json) and every
platform asked for; anything else is refused before anything is pushed.

Every platform built needs a meshagent binary for it: this binary for its own
platform, --agent OS/ARCH=PATH for the others (make build-linux-arm64); each
binary's init is the meshagent-init beside it. A multi-platform base gives a
multi-platform result.

The digest is printed on stdout, then the reference or file; progress goes to
stderr.

  meshagent image --base docker.io/istio/proxyv2:1.28.1 \
    --agent linux/arm64=bin/linux-arm64/meshagent \
    --push registry.example/meshagent-proxyv2:1.28.1`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.Base == "" {
				return usageError("image: --base is required (a reference such as docker.io/istio/proxyv2:1.28.1, or a tarball)")
			}
			if (o.Push == "") == (o.Output == "") {
				return usageError("image: give exactly one of --push REF and -o FILE")
			}
			var err error
			if o.Agents, err = agentBinaries(agents); err != nil {
				return err
			}
			if o.Labels, err = imageLabels(labels); err != nil {
				return err
			}
			for i, p := range o.Platforms {
				if o.Platforms[i], err = image.NormalizePlatform(p); err != nil {
					return usageError("image: --platform: %v", err)
				}
			}
			o.Version = currentVersion().Version
			o.Progress = cli.stderr
			o.Terminal = isTerminal(cli.stderr)
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			res, err := image.Build(ctx, o)
			if err != nil {
				return fmt.Errorf("image: %w", err)
			}
			where := o.Push
			if where == "" {
				where = o.Output
			}
			fmt.Fprintf(cli.stdout, "%s %s (%s)\n", res.Digest, where, strings.Join(res.Platforms, ", "))
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Base, "base", "", "the base: Istio's proxyv2 image of your release (a reference), or tarball:PATH, oci:DIR")
	f.StringVar(&o.Push, "push", "", "push the result to this reference")
	f.StringVarP(&o.Output, "output", "o", "", "write the result to this file instead (docker-archive; an OCI archive for several platforms)")
	f.StringVar(&o.Tag, "tag", "", "the image's name inside the -o file (default meshagent-proxyv2:VERSION)")
	f.StringSliceVar(&o.Platforms, "platform", nil, "the platforms to build, OS/ARCH (default: every platform of the base)")
	f.StringArrayVar(&agents, "agent", nil, "OS/ARCH=PATH: the meshagent binary for a platform, meshagent-init beside it (repeatable)")
	f.StringArrayVar(&labels, "label", nil, "KEY=VALUE: a label to add (repeatable)")
	f.BoolVar(&o.Insecure, "insecure", false, "plain HTTP to the registries (loopback and private addresses always are)")
	return cmd
}

// agentBinaries are the --agent values by platform, and this binary for its
// own platform unless one was given.
func agentBinaries(flags []string) (map[string]image.Binaries, error) {
	out := map[string]image.Binaries{}
	for _, a := range flags {
		pl, p, ok := strings.Cut(a, "=")
		if !ok || p == "" {
			return nil, usageError("image: --agent %q: want OS/ARCH=PATH (linux/arm64=bin/linux-arm64/meshagent)", a)
		}
		key, err := image.NormalizePlatform(pl)
		if err != nil {
			return nil, usageError("image: --agent %q: %v", a, err)
		}
		out[key] = image.BinariesBeside(p)
	}
	if _, ok := out[image.OwnPlatform()]; !ok {
		if self, err := os.Executable(); err == nil {
			out[image.OwnPlatform()] = image.BinariesBeside(self)
		}
	}
	return out, nil
}

func imageLabels(flags []string) (map[string]string, error) {
	out := map[string]string{}
	for _, l := range flags {
		k, v, ok := strings.Cut(l, "=")
		if !ok || k == "" {
			return nil, usageError("image: --label %q: want KEY=VALUE", l)
		}
		out[k] = v
	}
	return out, nil
}

// isTerminal: w is a terminal (progress then shows bytes live).
func isTerminal(w any) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}
