package runtime

import (
	"fmt"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// OverlayOptions are the overlay mount options of the layers, each named
// by an O_PATH descriptor of this process (/proc/self/fd/N): overlay shows
// its options as given in every /proc/<pid>/mountinfo, the sandbox's own
// included, where host paths would tell sandbox code where the server keeps
// templates, builds and sandboxes. done closes the descriptors once the mount is
// made.
func OverlayOptions(lower []string, upper, work string) (opts string, done func(), err error) {
	names, done, err := openLayers(append(append(make([]string, 0, len(lower)+2), lower...), upper, work))
	if err != nil {
		return "", nil, err
	}
	n := len(lower)
	return "lowerdir=" + strings.Join(names[:n], ":") + ",upperdir=" + names[n] + ",workdir=" + names[n+1], done, nil
}

// LowerOptions are the options of a read-only overlay of lower (two layers
// at least), each named by descriptor as in OverlayOptions.
func LowerOptions(lower []string) (opts string, done func(), err error) {
	names, done, err := openLayers(lower)
	if err != nil {
		return "", nil, err
	}
	return "lowerdir=" + strings.Join(names, ":"), done, nil
}

// openLayers opens each of dirs O_PATH and names it by its descriptor;
// done closes them. On an error none stays open.
func openLayers(dirs []string) (names []string, done func(), err error) {
	fds := make([]int, 0, len(dirs))
	done = func() {
		for _, fd := range fds {
			_ = unix.Close(fd)
		}
	}
	names = make([]string, 0, len(dirs))
	for _, d := range dirs {
		fd, err := unix.Open(d, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			done()
			return nil, nil, fmt.Errorf("layer %s: %w", d, err)
		}
		fds = append(fds, fd)
		names = append(names, "/proc/self/fd/"+strconv.Itoa(fd))
	}
	return names, done, nil
}
