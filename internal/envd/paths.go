package envd

import (
	"fmt"
	"path/filepath"
	"strings"

	"github.com/agentbox/agentbox/internal/errdefs"
)

// maxPathLen bounds paths from clients; Linux PATH_MAX is 4096.
const maxPathLen = 4096

// ResolvePath turns a client path into an absolute, clean path: "~" and
// "~/x" expand to home, relative paths are taken from home. It does not
// touch the filesystem; permissions are enforced when the path is used.
func ResolvePath(p, home string) (string, error) {
	if strings.IndexByte(p, 0) >= 0 {
		return "", fmt.Errorf("path contains a NUL byte: %w", errdefs.ErrInvalidArgument)
	}
	if len(p) > maxPathLen {
		return "", fmt.Errorf("path longer than %d bytes: %w", maxPathLen, errdefs.ErrInvalidArgument)
	}
	if !filepath.IsAbs(home) || strings.IndexByte(home, 0) >= 0 {
		home = "/"
	}
	switch {
	case p == "~":
		p = home
	case strings.HasPrefix(p, "~/"):
		p = filepath.Join(home, p[2:])
	case !filepath.IsAbs(p):
		p = filepath.Join(home, p)
	}
	return filepath.Clean(p), nil
}
