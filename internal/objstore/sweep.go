package objstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"github.com/minio/minio-go/v7"
)

// ImageGenerations lists the prefixes of every generation of a Sandbox's
// image stored under team/sandboxID/ (ImagePrefix), recorded or not: an
// agent that died between uploading and recording an image left one no
// annotation names.
func (s *Store) ImageGenerations(ctx context.Context, team, sandboxID string) ([]string, error) {
	root := team + "/" + sandboxID + "/"
	var out []string
	for o := range s.c.ListObjects(ctx, s.bucket, minio.ListObjectsOptions{Prefix: s.prefix + root, Recursive: true}) {
		if o.Err != nil {
			return nil, fmt.Errorf("list %s: %w", root, o.Err)
		}
		// Only <gen>/ holds an image: a SandboxSnapshot named like the
		// sandbox id keeps its objects under <name>/snapshot/.
		seg, _, ok := strings.Cut(strings.TrimPrefix(o.Key, s.prefix+root), "/")
		if !ok {
			continue
		}
		if gen, err := strconv.ParseInt(seg, 10, 64); err != nil || gen < 0 || strconv.FormatInt(gen, 10) != seg {
			continue
		}
		if p := root + seg + "/"; !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return out, nil
}

// SweepImages deletes every generation of a Sandbox's image but keep (""
// keeps none) whose objects are sealed for b: one that does not open for
// b is another Sandbox's, and stays. It returns the prefixes deleted.
func (s *Store) SweepImages(ctx context.Context, team, sandboxID string, b Binding, keep string) ([]string, error) {
	gens, err := s.ImageGenerations(ctx, team, sandboxID)
	if err != nil {
		return nil, err
	}
	var gone []string
	var errs []error
	for _, p := range gens {
		if p == keep {
			continue
		}
		ours, err := s.owns(ctx, p, b)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if !ours {
			continue
		}
		if err := s.DeletePrefix(ctx, p); err != nil {
			errs = append(errs, err)
			continue
		}
		gone = append(gone, p)
	}
	return gone, errors.Join(errs...)
}

// owns reports whether the image under prefix is sealed for b: its
// manifest, or (an upload cut short before it) its image, opens for b.
// A prefix with neither object holds nothing of an image.
func (s *Store) owns(ctx context.Context, prefix string, b Binding) (bool, error) {
	for _, name := range []string{prefix + manifestObject, prefix + imageObject} {
		if _, err := s.c.StatObject(ctx, s.bucket, s.prefix+name, minio.StatObjectOptions{}); err != nil {
			if minio.ToErrorResponse(err).Code == "NoSuchKey" {
				continue
			}
			return false, fmt.Errorf("stat %s: %w", name, err)
		}
		r, err := s.Get(ctx, name, b)
		if err != nil {
			return false, err
		}
		// The first chunk authenticates the binding.
		_, err = r.Read(make([]byte, 1))
		r.Close()
		switch {
		case err == nil || errors.Is(err, io.EOF):
			return true, nil
		case errors.Is(err, ErrIntegrity):
			return false, nil
		default:
			return false, fmt.Errorf("read %s: %w", name, err)
		}
	}
	return false, nil
}

// DeleteOwned deletes the image under prefix when it is sealed for b (also
// an upload cut short before its manifest), and reports whether it did:
// whoever deletes a recorded-or-not image by its prefix leaves another
// object's image there untouched.
func (s *Store) DeleteOwned(ctx context.Context, prefix string, b Binding) (bool, error) {
	ours, err := s.owns(ctx, prefix, b)
	if err != nil || !ours {
		return false, err
	}
	if err := s.DeletePrefix(ctx, prefix); err != nil {
		return false, err
	}
	return true, nil
}
