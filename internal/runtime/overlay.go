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
	var fds []int
	done = func() {
		for _, fd := range fds {
			_ = unix.Close(fd)
		}
	}
	name := func(p string) (string, error) {
		fd, err := unix.Open(p, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return "", fmt.Errorf("layer %s: %w", p, err)
		}
		fds = append(fds, fd)
		return "/proc/self/fd/" + strconv.Itoa(fd), nil
	}
	names := make([]string, 0, len(lower))
	for _, l := range lower {
		n, err := name(l)
		if err != nil {
			done()
			return "", nil, err
		}
		names = append(names, n)
	}
	up, err := name(upper)
	if err != nil {
		done()
		return "", nil, err
	}
	wk, err := name(work)
	if err != nil {
		done()
		return "", nil, err
	}
	return "lowerdir=" + strings.Join(names, ":") + ",upperdir=" + up + ",workdir=" + wk, done, nil
}

// LowerOptions are the options of a read-only overlay of lower (two layers
// at least), each named by descriptor as in OverlayOptions.
func LowerOptions(lower []string) (opts string, done func(), err error) {
	var fds []int
	done = func() {
		for _, fd := range fds {
			_ = unix.Close(fd)
		}
	}
	names := make([]string, 0, len(lower))
	for _, l := range lower {
		fd, err := unix.Open(l, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			done()
			return "", nil, fmt.Errorf("layer %s: %w", l, err)
		}
		fds = append(fds, fd)
		names = append(names, "/proc/self/fd/"+strconv.Itoa(fd))
	}
	return "lowerdir=" + strings.Join(names, ":"), done, nil
}
