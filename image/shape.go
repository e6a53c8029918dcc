package image

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/klauspost/compress/zstd"
)

// checkShape reads every layer of img (downloading it, into the cache for
// a registry base) and checks that the flattened file system has each file
// of proxyv2's shape, as a regular file or a link. Whiteouts of later layers
// remove what earlier ones added, as the container runtime applies them.
func checkShape(img v1.Image, given, pl string, p *progress) error {
	layers, err := img.Layers()
	if err != nil {
		return fmt.Errorf("%w %s (%s): %w", ErrBase, given, pl, err)
	}
	present := map[string]bool{}
	for i, l := range layers {
		size, _ := l.Size()
		step := fmt.Sprintf("%s: layer %d/%d", pl, i+1, len(layers))
		if err := scanLayer(l, p.counter(step, size), present); err != nil {
			return fmt.Errorf("%w %s (%s, layer %d): %w", ErrBase, given, pl, i+1, err)
		}
		p.done(step, size)
	}
	var missing []string
	for _, s := range shape {
		if !present[s.path] {
			missing = append(missing, fmt.Sprintf("%s (%s)", s.path, s.what))
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: %s (%s) has no %s", ErrNotProxyv2, given, pl, strings.Join(missing, ", no "))
	}
	p.stepf("%s: %s has proxyv2's shape: %s, %s, %s", pl, given, EnvoyPath, AgentPath, TemplatePath)
	return nil
}

// scanLayer applies one layer's entries to present (the shape's paths that
// exist so far). The whole compressed layer is read, so that the cache
// holds it.
func scanLayer(l v1.Layer, count io.Writer, present map[string]bool) error {
	rc, err := l.Compressed()
	if err != nil {
		return err
	}
	defer rc.Close()
	compressed := bufio.NewReader(io.TeeReader(rc, count))
	r, err := decompress(compressed)
	if err != nil {
		return err
	}
	defer r.Close()
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("not a tar archive: %w", err)
		}
		name := path.Clean("/" + h.Name)
		dir, file := path.Split(name)
		switch {
		case file == ".wh..wh..opq": // the directory's earlier content is gone
			removeUnder(present, path.Clean(dir))
		case strings.HasPrefix(file, ".wh."):
			removeUnder(present, path.Join(dir, strings.TrimPrefix(file, ".wh.")))
		default:
			// A file replaced by a directory (or the reverse) is no file.
			removeUnder(present, name)
			switch h.Typeflag {
			case tar.TypeReg, tar.TypeSymlink, tar.TypeLink:
				present[name] = true
			}
		}
	}
	_, err = io.Copy(io.Discard, compressed) // the tar's padding, into the cache
	return err
}

// removeUnder removes p and everything under it.
func removeUnder(present map[string]bool, p string) {
	for k := range present {
		if k == p || strings.HasPrefix(k, strings.TrimSuffix(p, "/")+"/") {
			delete(present, k)
		}
	}
}

// decompress reads a layer blob as its magic says: gzip (docker's and most
// OCI layers), zstd, or an uncompressed tar.
func decompress(r *bufio.Reader) (io.ReadCloser, error) {
	magic, _ := r.Peek(4)
	switch {
	case bytes.HasPrefix(magic, []byte{0x1f, 0x8b}):
		return gzip.NewReader(r)
	case bytes.HasPrefix(magic, []byte{0x28, 0xb5, 0x2f, 0xfd}):
		d, err := zstd.NewReader(r)
		if err != nil {
			return nil, err
		}
		return d.IOReadCloser(), nil
	}
	return io.NopCloser(r), nil
}
