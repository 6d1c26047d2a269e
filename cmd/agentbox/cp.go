package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	agentbox "github.com/agentbox/agentbox/sdk/go"
)

func newCpCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "cp <src> <dst>",
		Short: "Copy files between this machine and a sandbox",
		Long: `Copy a file or directory into or out of a sandbox. Exactly one side is
<id>:<path>; a relative sandbox path is relative to the user's home. Files
are streamed, never held in memory. "-" as the local side is stdin or stdout.
When the destination is an existing directory (or ends in "/") the source
keeps its name inside it.`,
		Example: `  agentbox cp ./data.csv i1a2b3c:/home/user/data.csv
  agentbox cp ./project i1a2b3c:work/
  agentbox cp i1a2b3c:/tmp/report.pdf .
  tar c src | agentbox cp - i1a2b3c:src.tar`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			srcID, srcPath, srcRemote := splitRemote(args[0])
			dstID, dstPath, dstRemote := splitRemote(args[1])
			if srcRemote == dstRemote {
				return errors.New("cp: exactly one of <src> and <dst> must be <id>:<path>")
			}
			ctx := cmd.Context()
			id := srcID
			if dstRemote {
				id = dstID
			}
			sbx, err := connect(ctx, cmd, id)
			if err != nil {
				return err
			}
			if dstRemote {
				return upload(ctx, sbx.Files, cmd.InOrStdin(), srcPath, dstPath)
			}
			return download(ctx, sbx.Files, cmd.OutOrStdout(), srcPath, dstPath)
		},
	}
}

// splitRemote recognizes "<id>:<path>". A local path containing ':' is
// still local when a '/' comes before the colon (e.g. ./a:b).
func splitRemote(arg string) (id, p string, remote bool) {
	before, after, ok := strings.Cut(arg, ":")
	if !ok || before == "" || strings.Contains(before, "/") {
		return "", arg, false
	}
	return before, after, true
}

func upload(ctx context.Context, files *agentbox.Files, stdin io.Reader, src, dst string) error {
	if src == "-" {
		_, err := files.WriteStream(ctx, dst, stdin)
		return err
	}
	st, err := os.Stat(src)
	if err != nil {
		return err
	}
	if strings.HasSuffix(dst, "/") || dst == "" {
		dst = path.Join(dst, filepath.Base(src))
	} else if info, err := files.Stat(ctx, dst); err == nil && info.Type == agentbox.FileTypeDir {
		dst = path.Join(dst, filepath.Base(src))
	}
	if !st.IsDir() {
		return uploadFile(ctx, files, src, dst)
	}
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		target := path.Join(dst, filepath.ToSlash(rel))
		switch {
		case d.IsDir():
			_, err = files.MakeDir(ctx, target)
			return err
		case d.Type().IsRegular():
			return uploadFile(ctx, files, p, target)
		}
		return nil // symlinks, devices: skipped
	})
}

func uploadFile(ctx context.Context, files *agentbox.Files, src, dst string) error {
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = files.WriteStream(ctx, dst, f)
	return err
}

func download(ctx context.Context, files *agentbox.Files, stdout io.Writer, src, dst string) error {
	if dst == "-" {
		return downloadTo(ctx, files, src, stdout)
	}
	info, err := files.Stat(ctx, src)
	if err != nil {
		return err
	}
	if st, err := os.Stat(dst); (err == nil && st.IsDir()) || strings.HasSuffix(dst, string(os.PathSeparator)) {
		dst = filepath.Join(dst, path.Base(info.Path))
	}
	if info.Type != agentbox.FileTypeDir {
		return downloadFile(ctx, files, info.Path, dst, info.Mode)
	}
	entries, err := files.List(ctx, info.Path, 64)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return err
	}
	for _, e := range entries {
		rel := strings.TrimPrefix(strings.TrimPrefix(e.Path, info.Path), "/")
		if rel == "" || !filepath.IsLocal(rel) {
			continue
		}
		target := filepath.Join(dst, filepath.FromSlash(rel))
		switch e.Type {
		case agentbox.FileTypeDir:
			err = os.MkdirAll(target, 0o755)
		case agentbox.FileTypeFile:
			err = downloadFile(ctx, files, e.Path, target, e.Mode)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func downloadFile(ctx context.Context, files *agentbox.Files, src, dst string, mode fs.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(dst), "."+filepath.Base(dst)+".part-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := downloadTo(ctx, files, src, tmp); err != nil {
		tmp.Close()
		return err
	}
	if mode == 0 {
		mode = 0o644
	}
	// CreateTemp makes 0600 files; keep the sandbox file's permissions.
	if err := tmp.Chmod(mode.Perm()); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	// Only a complete download replaces dst.
	return os.Rename(tmp.Name(), dst)
}

func downloadTo(ctx context.Context, files *agentbox.Files, src string, w io.Writer) error {
	rc, err := files.ReadStream(ctx, src)
	if err != nil {
		return err
	}
	defer rc.Close()
	if _, err := io.Copy(w, rc); err != nil {
		return fmt.Errorf("read %s: %w", src, err)
	}
	return nil
}
