//go:build linux && !amd64

package confine

import (
	"errors"

	"golang.org/x/sys/unix"
)

var errNoFilter = errors.New("confine: the seccomp filter is built for linux/amd64 only")

func installFilter() error { return errNoFilter }

func filterProg(bool, ...uint32) ([]unix.SockFilter, error) { return nil, errNoFilter }
