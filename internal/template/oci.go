package template

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/agentbox/agentbox/internal/errdefs"
)

// Image source prefixes. A bare reference ("debian:12",
// "registry.example.com/team/app:v1") is pulled from its registry.
const (
	SourceOCILayout     = "oci:"            // oci:<dir>  an OCI image layout directory
	SourceDockerArchive = "docker-archive:" // docker-archive:<file>  a `docker save` tarball
)

// RegistryAuth are credentials for a registry pull.
type RegistryAuth struct {
	Username string
	Password string
}

// openImage resolves src to an image without reading its layers yet. A
// registry image is pulled through rt (the destination policy's
// transport), guarded so no answer that is not a registry's reaches
// progress or the error. registry is the registry's name, "" for images
// on disk.
func openImage(ctx context.Context, src string, auth *RegistryAuth, rt http.RoundTripper, progress io.Writer) (img v1.Image, registry string, err error) {
	switch {
	case strings.HasPrefix(src, SourceOCILayout):
		dir := strings.TrimPrefix(src, SourceOCILayout)
		p, err := layout.FromPath(dir)
		if err != nil {
			return nil, "", fmt.Errorf("OCI layout %s: %w (%w)", dir, err, errdefs.ErrInvalidArgument)
		}
		idx, err := p.ImageIndex()
		if err != nil {
			return nil, "", fmt.Errorf("OCI layout %s: %w (%w)", dir, err, errdefs.ErrInvalidArgument)
		}
		img, err := imageFromIndex(idx, dir)
		return img, "", err
	case strings.HasPrefix(src, SourceDockerArchive):
		file := strings.TrimPrefix(src, SourceDockerArchive)
		img, err := tarball.ImageFromPath(file, nil)
		if err != nil {
			return nil, "", fmt.Errorf("docker archive %s: %w (%w)", file, err, errdefs.ErrInvalidArgument)
		}
		return img, "", nil
	}
	ref, err := name.ParseReference(src)
	if err != nil {
		return nil, "", fmt.Errorf("image reference %q: %w (%w)", src, err, errdefs.ErrInvalidArgument)
	}
	registry = ref.Context().RegistryStr()
	opts := []remote.Option{
		remote.WithContext(ctx),
		remote.WithPlatform(v1.Platform{OS: "linux", Architecture: "amd64"}),
		remote.WithTransport(&registryGuard{rt: rt, progress: progress}),
	}
	if auth != nil && auth.Username != "" {
		opts = append(opts, remote.WithAuth(&authn.Basic{Username: auth.Username, Password: auth.Password}))
	}
	img, err = remote.Image(ref, opts...)
	if err != nil {
		return nil, registry, fmt.Errorf("pull %s: %w", ref.String(), pullError(registry, err))
	}
	return img, registry, nil
}

// imageFromIndex picks the linux/amd64 image of an index (or its only one),
// descending into nested indexes.
func imageFromIndex(idx v1.ImageIndex, where string) (v1.Image, error) {
	m, err := idx.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("%s: index: %w", where, err)
	}
	var candidates []v1.Descriptor
	for _, d := range m.Manifests {
		if d.Platform == nil || (d.Platform.OS == "linux" && d.Platform.Architecture == "amd64") {
			candidates = append(candidates, d)
		}
	}
	if len(candidates) == 0 {
		return nil, fmt.Errorf("%s: no linux/amd64 image among %d manifests: %w", where, len(m.Manifests), errdefs.ErrInvalidArgument)
	}
	d := candidates[0]
	if d.MediaType.IsIndex() {
		child, err := idx.ImageIndex(d.Digest)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", where, err)
		}
		return imageFromIndex(child, where)
	}
	return idx.Image(d.Digest)
}

// importImage unpacks every layer of the image src into the layer store
// (skipping layers already there: they are keyed by their diff ID, the
// digest of the uncompressed tar) and returns the image as a build state.
func (s *Store) importImage(ctx context.Context, src string, auth *RegistryAuth, progress io.Writer) (*buildState, error) {
	img, registry, err := openImage(ctx, src, auth, s.fetch, progress)
	if err != nil {
		return nil, err
	}
	// Errors of images on disk are the operator's to read whole.
	fetchErr := func(err error) error {
		if registry == "" {
			return err
		}
		return pullError(registry, err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("image %s: config: %w", src, fetchErr(err))
	}
	layers, err := img.Layers()
	if err != nil {
		return nil, fmt.Errorf("image %s: layers: %w", src, fetchErr(err))
	}
	st := &buildState{}
	// One budget of unpacked bytes and files for the whole image.
	budget := s.unpack.Or(DefaultUnpackLimits())
	for i, l := range layers {
		diff, err := l.DiffID()
		if err != nil {
			return nil, fmt.Errorf("image %s: layer %d: %w", src, i+1, fetchErr(err))
		}
		if budget.MaxBytes <= 0 || budget.MaxEntries <= 0 {
			lim := s.unpack.Or(DefaultUnpackLimits())
			return nil, fmt.Errorf("image %s: layer %d: the layers before it used up the limits of %s and %d files unpacked per image: %w",
				src, i+1, sizeName(lim.MaxBytes), lim.MaxEntries, errdefs.ErrTooLarge)
		}
		id := LayerKey("oci-diff", diff.String())
		var stats unpackStats
		cached, err := s.CreateLayer(ctx, id, "image "+src+" "+diff.String(), func(ctx context.Context, rootfs string) error {
			// The compressed blob, so the ratio limit can see its size;
			// the remote client checks its digest as it is read.
			rc, err := l.Compressed()
			if err != nil {
				return fetchErr(err)
			}
			defer rc.Close()
			stats, err = s.unpackArchive(ctx, rc, rootfs, budget)
			if err != nil {
				if errors.Is(err, errdefs.ErrTooLarge) {
					return err
				}
				return fetchErr(err)
			}
			// The layer store is shared and keyed by diff ID: a layer
			// whose content is not what its config claims would be
			// served to every image that names that diff ID.
			if stats.Digest != diff.String() {
				return fmt.Errorf("its content hashes to %s, not to the diff ID its image config names: %w", stats.Digest, errdefs.ErrInvalidArgument)
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("image %s: layer %d (%s): %w", src, i+1, diff.Hex[:12], err)
		}
		if cached {
			fmt.Fprintf(progress, "    layer %d/%d %s: cached\n", i+1, len(layers), diff.Hex[:12])
		} else {
			budget.MaxBytes -= stats.Bytes
			budget.MaxEntries -= stats.Entries
			fmt.Fprintf(progress, "    layer %d/%d %s: %d entries, %d whiteouts\n", i+1, len(layers), diff.Hex[:12], stats.Entries, stats.Whiteouts)
			if stats.SetuidStripped > 0 {
				fmt.Fprintf(progress, "    layer %d: dropped setuid/setgid bits of %d files\n", i+1, stats.SetuidStripped)
			}
			for _, r := range stats.Rejected {
				fmt.Fprintf(progress, "    layer %d: skipped unsafe entry %s\n", i+1, r)
			}
		}
		st.LayerIDs = append(st.LayerIDs, id)
	}
	c := cf.Config
	st.Env = c.Env
	st.Workdir = c.WorkingDir
	st.User = c.User
	st.Entrypoint, st.Cmd = c.Entrypoint, c.Cmd
	for p := range c.ExposedPorts {
		port, _, _ := strings.Cut(p, "/")
		if n, err := strconv.Atoi(port); err == nil {
			st.Exposed = append(st.Exposed, n)
		}
	}
	return st, nil
}
