package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// templateDirFile, in the data dir, names the template store the server
// serves from. `serve --template-dir` may put the store outside the data dir
// (scripts/up.sh shares /var/cache/agentbox/templates with the e2e tests);
// the operator commands on the host read this file so that a plain
// `sudo agentbox template build NAME` lands where the server looks.
const templateDirFile = "template-dir"

// templateStoreDir is the one place that decides the template store of a
// data dir: an explicit --template-dir, else the store the server on that
// data dir recorded, else <data-dir>/templates.
func templateStoreDir(dataDir, flag string) string {
	if flag != "" {
		return flag
	}
	if dir, err := recordedTemplateDir(dataDir); err == nil && dir != "" {
		return dir
	}
	return filepath.Join(dataDir, "templates")
}

// recordedTemplateDir reads <data-dir>/template-dir; "" when there is none.
func recordedTemplateDir(dataDir string) (string, error) {
	b, err := os.ReadFile(filepath.Join(dataDir, templateDirFile))
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	dir := strings.TrimSpace(string(b))
	if !filepath.IsAbs(dir) || strings.ContainsAny(dir, "\n\x00") {
		return "", fmt.Errorf("%s: %q is not an absolute path", filepath.Join(dataDir, templateDirFile), dir)
	}
	return filepath.Clean(dir), nil
}

// recordTemplateDir writes dir (made absolute) to <data-dir>/template-dir,
// replacing the file whole so a reader never sees half of it.
func recordTemplateDir(dataDir, dir string) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return fmt.Errorf("--template-dir: %w", err)
	}
	if cur, err := recordedTemplateDir(dataDir); err == nil && cur == abs {
		return nil
	}
	tmp, err := os.CreateTemp(dataDir, "."+templateDirFile+"-*")
	if err != nil {
		return fmt.Errorf("record template dir: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.WriteString(abs + "\n"); err != nil {
		tmp.Close()
		return fmt.Errorf("record template dir: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("record template dir: %w", err)
	}
	if err := os.Rename(tmp.Name(), filepath.Join(dataDir, templateDirFile)); err != nil {
		return fmt.Errorf("record template dir: %w", err)
	}
	return nil
}
