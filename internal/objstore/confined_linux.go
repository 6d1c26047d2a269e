package objstore

import (
	"context"
	"errors"
	"fmt"
	"io"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/confine"
	"github.com/agentbox/agentbox/internal/untar"
)

// UnpackHook is `agentbox __hook image-unpack <limits>`: Unpack of an
// image from standard input, confined as untar.Unpacker says. The child
// keeps CAP_CHOWN, CAP_FOWNER, CAP_DAC_OVERRIDE, CAP_FSETID (the layer's
// owners, modes and set-id bits) and CAP_SETFCAP (namespaced file
// capabilities).
const UnpackHook = "image-unpack"

// imageUnpacker is the confined entry point of restored images.
func imageUnpacker() untar.Unpacker {
	return untar.Unpacker{
		Hook:     UnpackHook,
		Keep:     []uintptr{unix.CAP_CHOWN, unix.CAP_FOWNER, unix.CAP_DAC_OVERRIDE, unix.CAP_FSETID, unix.CAP_SETFCAP},
		Defaults: DefaultUnpackLimits(),
		Refusal:  ErrUnsafeImage,
		Clean: func(n string) (string, bool) {
			name, ok := cleanName(n)
			return name, ok && name != "." // the image's root is never opaque
		},
	}
}

// unpackConfined runs Unpack of r into dir in `self __hook image-unpack`.
// Refusals wrap ErrUnsafeImage as Unpack's do, with the same message.
func unpackConfined(ctx context.Context, self string, r io.Reader, dir string, lim untar.Limits) error {
	err := imageUnpacker().Run(ctx, self, r, dir, lim, nil)
	if errors.Is(err, confine.ErrNamedOutside) {
		return fmt.Errorf("%w: %w", err, ErrUnsafeImage)
	}
	return err
}

// RunUnpackHook is the child's side of unpackConfined.
func RunUnpackHook(args []string) error {
	return imageUnpacker().Serve(args, func(ctx context.Context, r io.Reader, root string, lim untar.Limits) ([]string, any, error) {
		opaque, err := unpack(ctx, r, root, lim, true)
		return opaque, nil, err
	})
}
