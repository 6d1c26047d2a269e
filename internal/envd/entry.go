package envd

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/agentbox/agentbox/api/gen/filesystem"
)

// metadataPrefix is the xattr namespace of user-defined file metadata.
const metadataPrefix = "user.e2b."

// entryInfo describes path (absolute, clean). For a symlink the type is that
// of its target and symlinkTarget is set; a dangling link is a file.
func (s *Server) entryInfo(path string) (*filesystem.EntryInfo, error) {
	lfi, err := os.Lstat(path)
	if err != nil {
		return nil, err
	}
	return s.entryFromInfo(path, lfi), nil
}

func (s *Server) entryFromInfo(path string, lfi fs.FileInfo) *filesystem.EntryInfo {
	e := &filesystem.EntryInfo{
		Name:         filepath.Base(path),
		Path:         path,
		Size:         lfi.Size(),
		Mode:         uint32(lfi.Mode().Perm()),
		Permissions:  lfi.Mode().String(),
		ModifiedTime: timestamppb.New(lfi.ModTime()),
		Type:         fileType(lfi.Mode()),
	}
	if st, ok := lfi.Sys().(*syscall.Stat_t); ok {
		e.Owner = s.users.UserName(st.Uid)
		e.Group = s.users.GroupName(st.Gid)
	}
	if lfi.Mode()&fs.ModeSymlink != 0 {
		if target, err := os.Readlink(path); err == nil {
			if !filepath.IsAbs(target) {
				target = filepath.Join(filepath.Dir(path), target)
			}
			e.SymlinkTarget = &target
		}
		e.Type = filesystem.FileType_FILE_TYPE_FILE
		if fi, err := os.Stat(path); err == nil {
			e.Type = fileType(fi.Mode())
		}
	}
	e.Metadata = readMetadata(path)
	return e
}

func fileType(m fs.FileMode) filesystem.FileType {
	switch {
	case m.IsDir():
		return filesystem.FileType_FILE_TYPE_DIRECTORY
	case m&fs.ModeSymlink != 0:
		return filesystem.FileType_FILE_TYPE_SYMLINK
	default:
		return filesystem.FileType_FILE_TYPE_FILE
	}
}

// readMetadata returns the user.e2b.* xattrs of path (not following
// symlinks), prefix stripped; nil when there are none.
func readMetadata(path string) map[string]string {
	buf := make([]byte, 4096)
	n, err := unix.Llistxattr(path, buf)
	if err != nil || n == 0 {
		return nil
	}
	var md map[string]string
	val := make([]byte, 4096)
	for _, name := range strings.Split(string(buf[:n]), "\x00") {
		key, ok := strings.CutPrefix(name, metadataPrefix)
		if !ok || key == "" {
			continue
		}
		m, err := unix.Lgetxattr(path, name, val)
		if err != nil {
			continue
		}
		if md == nil {
			md = map[string]string{}
		}
		md[key] = string(val[:m])
	}
	return md
}

// validateMetadata enforces printable ASCII keys and values, at most 246
// bytes per key and 4096 bytes in total (prefix counted per key).
func validateMetadata(md map[string]string) error {
	total := 0
	for k, v := range md {
		if k == "" || len(k) > 255-len(metadataPrefix) {
			return fmt.Errorf("metadata key %q: length must be 1..%d", k, 255-len(metadataPrefix))
		}
		if !printableASCII(k) || !printableASCII(v) {
			return fmt.Errorf("metadata %q: keys and values must be printable ASCII", k)
		}
		total += len(metadataPrefix) + len(k) + len(v)
	}
	if total > 4096 {
		return fmt.Errorf("metadata is %d bytes, more than 4096", total)
	}
	return nil
}

func printableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// replaceMetadata sets exactly md as the user.e2b.* xattrs of the open file.
func replaceMetadata(f *os.File, md map[string]string) error {
	fd := int(f.Fd())
	buf := make([]byte, 4096)
	if n, err := unix.Flistxattr(fd, buf); err == nil {
		for _, name := range strings.Split(string(buf[:n]), "\x00") {
			if strings.HasPrefix(name, metadataPrefix) {
				if _, keep := md[strings.TrimPrefix(name, metadataPrefix)]; !keep {
					_ = unix.Fremovexattr(fd, name)
				}
			}
		}
	}
	for k, v := range md {
		if err := unix.Fsetxattr(fd, metadataPrefix+k, []byte(v), 0); err != nil {
			return fmt.Errorf("set metadata %q on %s: %w", k, f.Name(), err)
		}
	}
	return nil
}
