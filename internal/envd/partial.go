package envd

import "os"

// discardPartial undoes what a failed upload wrote to f, opened at path, so
// that no half-written file stays under the target's name: a file the
// upload created is removed, an existing one (already truncated by the
// in-place write) is left empty. The client is told the upload failed; an
// upload cut by a server restart or a dropped connection ends here.
func discardPartial(path string, f *os.File, created bool) {
	_ = f.Truncate(0)
	if !created {
		return
	}
	// Remove the name only while it still names f: something else may have
	// been put there since.
	fi, err := f.Stat()
	if err != nil {
		return
	}
	if cur, err := os.Lstat(path); err == nil && os.SameFile(fi, cur) {
		_ = os.Remove(path)
	}
}
