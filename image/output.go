package image

import (
	"archive/tar"
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// write pushes the result, or writes it to the file: under a temporary name
// renamed at the end, so that a failed write leaves no half-made file. It
// returns the digest of what it wrote: a pushed index stays an index (a
// user's manifests name it by its tag); a file of one platform is a
// docker-archive of its image, which every loader reads.
func (d destination) write(ctx context.Context, r built, o Options, p *progress) (v1.Hash, error) {
	if d.push != nil {
		return d.pushTo(ctx, r, o, p)
	}
	return d.writeFile(r, p)
}

// pushTo pushes the result, an index as an index, with the progress of
// go-containerregistry's writer.
func (d destination) pushTo(ctx context.Context, r built, o Options, p *progress) (v1.Hash, error) {
	var digest v1.Hash
	var err error
	if r.index != nil {
		digest, err = r.index.Digest()
	} else {
		digest, err = r.image.Digest()
	}
	if err != nil {
		return v1.Hash{}, err
	}
	step := "pushing " + d.push.String()
	ch := make(chan v1.Update, 64)
	done := make(chan struct{})
	go p.updates(step, ch, done)
	opts := append(o.remoteOptions(ctx), remote.WithProgress(ch)) // the writer closes ch
	if r.index != nil {
		err = remote.WriteIndex(d.push, r.index, opts...)
	} else {
		err = remote.Write(d.push, r.image, opts...)
	}
	<-done
	if err != nil {
		return v1.Hash{}, fmt.Errorf("push %s: %w", d.push, err)
	}
	return digest, nil
}

// writeFile writes the docker-archive of one platform's image, or the OCI
// archive of several.
func (d destination) writeFile(r built, p *progress) (v1.Hash, error) {
	single := r.image != nil
	var digest v1.Hash
	var err error
	if single {
		digest, err = r.image.Digest()
	} else {
		digest, err = r.index.Digest()
	}
	if err != nil {
		return v1.Hash{}, err
	}
	if err := os.MkdirAll(filepath.Dir(d.file), 0o755); err != nil {
		return v1.Hash{}, fmt.Errorf("%w: -o %s: %w", ErrOutput, d.file, err)
	}
	f, err := os.CreateTemp(filepath.Dir(d.file), filepath.Base(d.file)+".*")
	if err != nil {
		return v1.Hash{}, fmt.Errorf("%w: -o %s: %w", ErrOutput, d.file, err)
	}
	defer os.Remove(f.Name())
	step := "writing " + d.file
	w := io.MultiWriter(f, p.counter(step, 0))
	if single {
		err = tarball.Write(d.tag, r.image, w)
	} else {
		err = writeOCIArchive(w, r.index, d.tag.String())
	}
	if err == nil {
		err = f.Chmod(0o644)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), d.file)
	}
	if err != nil {
		return v1.Hash{}, fmt.Errorf("write %s: %w", d.file, err)
	}
	fi, _ := os.Stat(d.file)
	p.done(step, fi.Size())
	return digest, nil
}

// writeOCIArchive writes idx as a tar of an OCI image layout (what `ctr
// images import` and `docker load` read for several platforms), named tag.
func writeOCIArchive(w io.Writer, idx v1.ImageIndex, tag string) error {
	dir, err := os.MkdirTemp("", "meshagent-image-oci-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	lp, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	if err := lp.AppendIndex(idx, layout.WithAnnotations(map[string]string{
		"org.opencontainers.image.ref.name": tag,
		"io.containerd.image.name":          tag,
	})); err != nil {
		return err
	}
	tw := tar.NewWriter(w)
	err = filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		fi, err := e.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		h, err := tar.FileInfoHeader(fi, "")
		if err != nil {
			return err
		}
		h.Name, h.ModTime, h.Uid, h.Gid, h.Uname, h.Gname = filepath.ToSlash(rel), epoch, 0, 0, "", ""
		if err := tw.WriteHeader(h); err != nil || !fi.Mode().IsRegular() {
			return err
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = io.Copy(tw, f)
		return err
	})
	if err != nil {
		return err
	}
	return tw.Close()
}
