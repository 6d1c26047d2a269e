package confine

import (
	"errors"
	"fmt"
	"io/fs"
	"os"

	"golang.org/x/sys/unix"
)

// ErrNamedOutside is MarkOpaque's answer to a name outside dir.
var ErrNamedOutside = errors.New("named outside its destination")

// MarkOpaque sets the overlay opaque marker (a trusted.* xattr, which a
// confined unpacker cannot set) on the directories it named under dir.
// clean validates each name as the unpacker's own entry names; a name that
// is no longer a directory there is skipped (a later entry replaced it),
// and no final symlink is followed.
func MarkOpaque(dir string, names []string, clean func(string) (string, bool)) error {
	if len(names) == 0 {
		return nil
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	for _, n := range names {
		name, ok := clean(n)
		if !ok {
			return fmt.Errorf("the confined unpacker named %q: %w", n, ErrNamedOutside)
		}
		f, err := root.OpenFile(name, os.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP) {
			continue
		}
		if err != nil {
			return fmt.Errorf("opaque marker %s: %w", name, err)
		}
		err = unix.Fsetxattr(int(f.Fd()), "trusted.overlay.opaque", []byte("y"), 0)
		f.Close()
		if err != nil {
			return fmt.Errorf("opaque marker %s: %w", name, err)
		}
	}
	return nil
}
