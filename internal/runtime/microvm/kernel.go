package microvm

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/agentbox/agentbox/internal/guestinit"
)

// Kernel is a guest kernel: an uncompressed vmlinux (booted through PVH,
// which skips the decompressor that is slow under TCG) and the modules the
// guest needs, in load order.
type Kernel struct {
	Version string
	Vmlinux string
	Modules []string // .ko paths, dependencies first
}

// findKernel returns the newest kernel under dir: dir/<version>/vmlinux
// with the modules listed in dir/<version>/modules/order, as
// scripts/install-deps.sh lays them out.
func findKernel(dir string) (Kernel, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return Kernel{}, err
	}
	var versions []string
	for _, e := range entries {
		if e.IsDir() {
			versions = append(versions, e.Name())
		}
	}
	slices.Sort(versions)
	for _, v := range slices.Backward(versions) {
		k, err := readKernel(filepath.Join(dir, v), v)
		if err == nil {
			return k, nil
		}
	}
	return Kernel{}, fmt.Errorf("no guest kernel (vmlinux and modules/order) under %s", dir)
}

func readKernel(dir, version string) (Kernel, error) {
	k := Kernel{Version: version, Vmlinux: filepath.Join(dir, "vmlinux")}
	if _, err := os.Stat(k.Vmlinux); err != nil {
		return Kernel{}, err
	}
	f, err := os.Open(filepath.Join(dir, "modules", "order"))
	if err != nil {
		return Kernel{}, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name := strings.TrimSpace(sc.Text())
		if name == "" {
			continue
		}
		if filepath.Base(name) != name || !strings.HasSuffix(name, ".ko") {
			return Kernel{}, fmt.Errorf("modules/order: %q is not a module file name", name)
		}
		p := filepath.Join(dir, "modules", name)
		if _, err := os.Stat(p); err != nil {
			return Kernel{}, err
		}
		k.Modules = append(k.Modules, p)
	}
	return k, sc.Err()
}

// buildInitrd writes, under dir, the initrd of kernel k with envd as its
// /init, and returns its path. The name is keyed by its inputs, so a new
// envd or kernel makes a new initrd and an existing one is reused.
func buildInitrd(dir string, k Kernel, envd string) (string, error) {
	h := sha256.New()
	fmt.Fprintln(h, k.Version)
	for _, p := range append([]string{envd}, k.Modules...) {
		f, err := os.Open(p)
		if err != nil {
			return "", err
		}
		_, err = io.Copy(h, f)
		f.Close()
		if err != nil {
			return "", err
		}
	}
	out := filepath.Join(dir, "initrd-"+hex.EncodeToString(h.Sum(nil))[:16]+".cpio")
	if _, err := os.Stat(out); err == nil {
		return out, nil
	}
	tmp, err := os.CreateTemp(dir, ".initrd-*")
	if err != nil {
		return "", err
	}
	defer os.Remove(tmp.Name())
	w := newCpio(tmp)
	var order strings.Builder
	w.dir(strings.TrimPrefix(guestinit.ModulesDir, "/"), 0o755)
	for _, m := range k.Modules {
		if err := w.file(strings.TrimPrefix(guestinit.ModulesDir, "/")+"/"+filepath.Base(m), m, 0o644); err != nil {
			return "", err
		}
		order.WriteString(filepath.Base(m) + "\n")
	}
	w.data(strings.TrimPrefix(guestinit.ModulesDir, "/")+"/order", []byte(order.String()), 0o644)
	if err := w.file(strings.TrimPrefix(guestinit.InitPath, "/"), envd, 0o755); err != nil {
		return "", err
	}
	if err := w.close(); err != nil {
		return "", err
	}
	if err := tmp.Close(); err != nil {
		return "", err
	}
	if err := os.Rename(tmp.Name(), out); err != nil {
		return "", err
	}
	return out, nil
}

// cpio writes the "newc" archive format the kernel unpacks as initramfs.
type cpio struct {
	w   *bufio.Writer
	ino int
	err error
}

func newCpio(w io.Writer) *cpio { return &cpio{w: bufio.NewWriter(w), ino: 1} }

func (c *cpio) header(name string, mode uint32, size int) {
	if c.err != nil {
		return
	}
	c.ino++
	_, c.err = fmt.Fprintf(c.w, "070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%s\x00",
		c.ino, mode, 0, 0, 1, 0, size, 0, 0, 0, 0, len(name)+1, 0, name)
	c.pad(110 + len(name) + 1)
}

func (c *cpio) pad(n int) {
	if c.err == nil && n%4 != 0 {
		_, c.err = c.w.Write(make([]byte, 4-n%4))
	}
}

func (c *cpio) dir(name string, perm uint32) { c.header(name, 0o040000|perm, 0) }

func (c *cpio) data(name string, b []byte, perm uint32) {
	c.header(name, 0o100000|perm, len(b))
	if c.err == nil {
		_, c.err = c.w.Write(b)
	}
	c.pad(len(b))
}

func (c *cpio) file(name, src string, perm uint32) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	c.data(name, b, perm)
	return c.err
}

func (c *cpio) close() error {
	c.header("TRAILER!!!", 0, 0)
	if c.err != nil {
		return c.err
	}
	return c.w.Flush()
}
