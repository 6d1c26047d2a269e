//go:build linux && !amd64

package confine

import "errors"

func installFilter() error {
	return errors.New("confine: the tool's seccomp filter is built for linux/amd64 only")
}
