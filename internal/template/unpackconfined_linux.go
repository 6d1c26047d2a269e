package template

import (
	"context"
	"io"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/untar"
)

// UnpackHook is `agentbox __hook unpack <limits>`: unpackArchive,
// confined as untar.Unpacker says. Image layers and uploaded build
// contexts are archives a tenant wrote; their decompression, tar parsing
// and file creation run in this child, never in the server. The child
// keeps CAP_CHOWN, CAP_FOWNER and CAP_DAC_OVERRIDE: numeric owners of any
// id, modes and times of files it made and chowned, entries in
// directories whose modes it already set.
const UnpackHook = "unpack"

// layerUnpacker is the confined entry point of layers and build contexts.
func layerUnpacker() untar.Unpacker {
	return untar.Unpacker{
		Hook:     UnpackHook,
		Keep:     []uintptr{unix.CAP_CHOWN, unix.CAP_FOWNER, unix.CAP_DAC_OVERRIDE},
		Defaults: DefaultUnpackLimits(),
		Refusal:  errdefs.ErrTooLarge,
		Clean:    cleanEntryName,
	}
}

// confinedUnpack runs unpackArchive in `self __hook unpack`: the archive
// r on its standard input, dir as its root. The result, the refusals
// included, is the in-process unpacker's: errors that wrapped
// errdefs.ErrTooLarge still do, with the same message.
func confinedUnpack(ctx context.Context, self string, r io.Reader, dir string, lim untar.Limits) (unpackStats, error) {
	var st unpackStats
	err := layerUnpacker().Run(ctx, self, r, dir, lim, &st)
	return st, err
}

// RunUnpackHook is the child's side of confinedUnpack.
func RunUnpackHook(args []string) error { return layerUnpacker().Serve(args, sealedUnpack) }

// sealedUnpack is the child's work: the archive into its root, the
// destination, with the opaque markers left to the server.
func sealedUnpack(ctx context.Context, r io.Reader, root string, lim untar.Limits) ([]string, any, error) {
	st, err := unpackArchiveTo(ctx, r, root, lim, true)
	opaque := st.Opaque
	st.Opaque = nil
	return opaque, st, err
}
