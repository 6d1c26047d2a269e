package template

import (
	"archive/tar"
	"fmt"
	"io"
	"io/fs"
	"os"
)

// WriteContextArchive writes the sources of a COPY step from its local
// context (step.ContextDir, filtered by step.Ignore) as a tar at their
// context-relative paths: what a client uploads for the step (the server
// extracts it and copies from it as from a context dir). Symlinks are
// archived as links, never followed; devices, FIFOs and sockets are left
// out; owners are not kept (COPY sets them).
func WriteContextArchive(step Step, w io.Writer) error {
	tw := tar.NewWriter(w)
	seen := map[string]bool{}
	err := walkSources(step, func(ctxRoot *os.Root, rel, _ string, d fs.DirEntry, _ bool) error {
		if seen[rel] || rel == "." {
			return nil
		}
		seen[rel] = true
		fi, err := d.Info()
		if err != nil {
			return err
		}
		hdr := &tar.Header{Name: rel, Mode: int64(fi.Mode().Perm()), ModTime: fi.ModTime(), Format: tar.FormatPAX}
		switch {
		case fi.IsDir():
			hdr.Typeflag, hdr.Name = tar.TypeDir, rel+"/"
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := ctxRoot.Readlink(rel)
			if err != nil {
				return err
			}
			hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, target
		case fi.Mode().IsRegular():
			hdr.Typeflag, hdr.Size = tar.TypeReg, fi.Size()
		default:
			return nil
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if hdr.Typeflag != tar.TypeReg {
			return nil
		}
		f, err := ctxRoot.Open(rel)
		if err != nil {
			return err
		}
		defer f.Close()
		n, err := io.Copy(tw, f)
		if err == nil && n != hdr.Size {
			err = fmt.Errorf("%s changed while it was archived", rel)
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("COPY %v: %w", step.Src, err)
	}
	return tw.Close()
}

// ShellCommand is a RUN, CMD or ENTRYPOINT step's command as one shell
// command line (exec form quoted).
func (s Step) ShellCommand() string {
	if s.Exec {
		return commandString(s.Args)
	}
	return commandString(shellOrExec(s))
}

// Argv is a CMD or ENTRYPOINT step's command as argv (shell form through
// /bin/sh -c).
func (s Step) Argv() []string { return shellOrExec(s) }
