package image

import (
	"archive/tar"
	"compress/gzip"
	"debug/elf"
	"fmt"
	"io"
	"maps"
	"os"
	"path"
	"slices"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// epoch is every timestamp of the layer: the same binaries give the same
// layer digest.
var epoch = time.Unix(0, 0).UTC()

// layer is base with meshagent's layer on top, the labels added and the
// entrypoint as entrypoint says; nothing else of the base's config changes.
// The layer is hashed here, before any push. entry says what became of the
// entrypoint, for the progress.
func (o Options) layer(base v1.Image, bin Binaries, b *base) (img v1.Image, entry string, err error) {
	mt, err := base.MediaType()
	if err != nil {
		return nil, "", err
	}
	layerType := types.DockerLayer
	if mt == types.OCIManifestSchema1 {
		layerType = types.OCILayer
	}
	l, err := tarball.LayerFromOpener(agentTar(bin), tarball.WithMediaType(layerType),
		tarball.WithCompressionLevel(gzip.BestSpeed), tarball.WithCompressedCaching)
	if err != nil {
		return nil, "", err
	}
	img, err = mutate.Append(base, mutate.Addendum{Layer: l, History: v1.History{
		Created:   v1.Time{Time: epoch},
		CreatedBy: "meshagent image: meshagent " + o.Version + " as " + AgentPath + ", " + InitName + " beside it",
		Comment:   "meshagent (#32)",
	}})
	if err != nil {
		return nil, "", err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, "", err
	}
	cf = cf.DeepCopy()
	if cf.Config.Labels == nil {
		cf.Config.Labels = map[string]string{}
	}
	maps.Copy(cf.Config.Labels, o.labels(cf, b))
	cf.Config.Entrypoint, entry = entrypoint(cf.Config.Entrypoint)
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, "", err
	}
	if _, err := img.Digest(); err != nil { // reads and compresses the layer now
		return nil, "", err
	}
	return img, entry, nil
}

// entrypoint is the result's ENTRYPOINT (#36). Istio's ([AgentPath]) becomes
// meshagent-init in front of the agent (AgentEntrypoint), so that a pod
// starts the agent's large binary once: with the agent as PID 1, it
// replaced itself with its init, which started it again, and its runtime
// and package initialisation ran twice, tenths of a second of CPU in a
// start storm's starved containers. The base's Cmd stays (Istio's injector
// sets only args: proxy sidecar, which the kubelet appends).
//
// Any other entrypoint (a base that wraps pilot-agent in its own script) is
// kept, not refused: the image works as before, the agent as PID 1 running
// its init itself, only without the saving; putting the init in front
// would bypass the wrapper.
func entrypoint(base []string) (ep []string, what string) {
	if slices.Equal(base, []string{AgentPath}) {
		return slices.Clone(AgentEntrypoint), fmt.Sprintf("entrypoint %q (the agent once per start, behind its init)", AgentEntrypoint)
	}
	return base, fmt.Sprintf("entrypoint %q kept: not Istio's [%s], so %s is not put in front of it (the agent, as PID 1, still runs its init itself)",
		base, AgentPath, InitName)
}

// labels are what the result says of itself: meshagent's version, the
// base's Istio version, the base.
func (o Options) labels(cf *v1.ConfigFile, b *base) map[string]string {
	l := map[string]string{
		LabelVersion:      o.Version,
		LabelIstioVersion: istioVersion(cf, b.tag),
		LabelBase:         b.given + "@" + b.digest.String(),
		LabelAgent:        "meshagent",
	}
	maps.Copy(l, o.Labels)
	return l
}

// istioVersion is the base's Istio version as the base says it (a label,
// the environment), else its tag (Istio tags proxyv2 by release: 1.28.1).
// Istio's own images carry neither label nor variable today.
func istioVersion(cf *v1.ConfigFile, tag string) string {
	for _, k := range []string{"io.istio.version", "org.opencontainers.image.version"} {
		if v := cf.Config.Labels[k]; v != "" {
			return v
		}
	}
	for _, e := range cf.Config.Env {
		if v, ok := strings.CutPrefix(e, "ISTIO_VERSION="); ok && v != "" {
			return v
		}
	}
	if tag != "" && tag != "latest" {
		return tag + " (the base's tag)"
	}
	return "unknown"
}

// agentTar opens the layer's tar: the agent as pilot-agent, the init beside
// it, and "meshagent" naming the agent, root-owned, 0755. No directory
// entries: the base's /usr/local/bin keeps its owner and mode.
func agentTar(bin Binaries) tarball.Opener {
	return func() (io.ReadCloser, error) {
		pr, pw := io.Pipe()
		go func() {
			tw := tar.NewWriter(pw)
			err := addFile(tw, AgentPath, bin.Agent)
			if err == nil {
				err = addFile(tw, InitPath, bin.Init)
			}
			if err == nil {
				err = tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: strings.TrimPrefix(AgentAlias, "/"),
					Linkname: path.Base(AgentPath), Mode: 0o777, ModTime: epoch, Format: tar.FormatPAX})
			}
			if err == nil {
				err = tw.Close()
			}
			pw.CloseWithError(err)
		}()
		return pr, nil
	}
}

func addFile(tw *tar.Writer, dst, src string) error {
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	h := &tar.Header{Typeflag: tar.TypeReg, Name: strings.TrimPrefix(dst, "/"), Mode: 0o755, Size: fi.Size(),
		ModTime: epoch, Format: tar.FormatPAX}
	if err := tw.WriteHeader(h); err != nil {
		return err
	}
	n, err := io.Copy(tw, f)
	if err == nil && n != fi.Size() {
		err = fmt.Errorf("%s changed while it was read", src)
	}
	return err
}

// elfMachines are the ELF machines of the architectures Istio builds
// proxyv2 for, and a few more.
var elfMachines = map[string]elf.Machine{
	"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64, "arm": elf.EM_ARM, "386": elf.EM_386,
	"ppc64le": elf.EM_PPC64, "s390x": elf.EM_S390, "riscv64": elf.EM_RISCV,
}

// checkBinary: p is a Linux executable for platform pl.
func checkBinary(p, pl string) error {
	fi, err := os.Stat(p)
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%s is not a regular file", p)
	}
	osName, arch, _ := strings.Cut(pl, "/")
	arch, _, _ = strings.Cut(arch, "/")
	if osName != "linux" {
		return fmt.Errorf("%s: only linux platforms are built, not %s", p, osName)
	}
	f, err := elf.Open(p)
	if err != nil {
		return fmt.Errorf("%s is not a Linux executable: %w", p, err)
	}
	defer f.Close()
	if want, ok := elfMachines[arch]; ok && f.Machine != want {
		return fmt.Errorf("%s is built for %s, not %s", p, f.Machine, pl)
	}
	return nil
}

// built is the result: the index of one image per platform when the base
// is an index, and the image when there is one platform.
type built struct {
	image v1.Image
	index v1.ImageIndex
}

// assemble puts the layered images together as the base was: a single
// image stays one, an index gives an index of the same media type with
// each platform's descriptor platform kept.
func assemble(b *base, platforms []string, images map[string]v1.Image) (built, error) {
	var r built
	if len(platforms) == 1 {
		r.image = images[platforms[0]]
	}
	if b.index == nil {
		return r, nil
	}
	mt, err := b.index.MediaType()
	if err != nil {
		return built{}, err
	}
	idx := mutate.IndexMediaType(empty.Index, mt)
	for _, pl := range platforms {
		d := b.descs[pl]
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: images[pl], Descriptor: v1.Descriptor{Platform: d.Platform}})
	}
	r.index = idx
	return r, nil
}
