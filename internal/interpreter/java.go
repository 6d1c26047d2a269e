package interpreter

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
)

type javaConfig struct {
	Java     string // java of a JDK (jshell's compiler is in the JDK only)
	Source   string // JavaKernel.java
	ClassDir string // where the compiled kernel is cached
	Cwd      string
	Log      io.Writer
}

// startJava runs assets/JavaKernel.java, a kernel on the JDK's jshell API
// that speaks the Node kernel's protocol.
func startJava(ctx context.Context, cfg javaConfig) (*nodeKernel, error) {
	// SerialGC: fewer threads and less memory per idle kernel than G1,
	// which a sandbox with a few cores does not need.
	args := []string{"-XX:+UseSerialGC"}
	if dir, err := compileJavaKernel(ctx, cfg); err == nil {
		args = append(args, "-cp", dir, "JavaKernel")
	} else {
		// The JVM can run the source file itself, compiling it in memory
		// at every start (seconds on a busy sandbox).
		fmt.Fprintf(cfg.Log, "java kernel: running from source: %v\n", err)
		args = append(args, cfg.Source)
	}
	cmd := exec.Command(cfg.Java, args...)
	cmd.Dir = cfg.Cwd
	cmd.Env = kernelEnv(nil)
	k, err := startEventKernel(ctx, &nodeKernel{name: "java kernel"}, cmd, cfg.Log)
	if err != nil {
		return nil, err
	}
	// A JVM reads its environment with System.getenv, but E2B's Java
	// contexts show the sandbox's env vars as system properties too
	// (System.getProperty("VAR")), as per-execution envs are.
	if err := k.Execute(ctx, envPropertiesCode(envMap(cmd.Env)), true, discard{}); err != nil {
		k.Close()
		return nil, fmt.Errorf("java kernel: set env vars as system properties: %w", err)
	}
	return k, nil
}

// envPropertiesCode sets each variable of env as a system property the JVM
// does not define itself (its own are dotted, like java.home).
func envPropertiesCode(env map[string]string) string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(env)) {
		if !envName.MatchString(k) {
			continue
		}
		fmt.Fprintf(&b, "if (System.getProperty(%s) == null) System.setProperty(%s, %s);\n", jsonString(k), jsonString(k), jsonString(env[k]))
	}
	return b.String()
}

// compileJavaKernel compiles the kernel once per version of its source,
// with the javac next to java, and returns the class directory. Kernels
// starting at the same time may each compile it; one rename wins.
func compileJavaKernel(ctx context.Context, cfg javaConfig) (string, error) {
	src, err := os.ReadFile(cfg.Source)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(src)
	dir := filepath.Join(cfg.ClassDir, hex.EncodeToString(sum[:8]))
	if _, err := os.Stat(filepath.Join(dir, "JavaKernel.class")); err == nil {
		return dir, nil
	}
	if err := os.MkdirAll(cfg.ClassDir, 0o755); err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp(cfg.ClassDir, "build-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp) // gone after the rename
	javac := "javac"
	if d := filepath.Dir(cfg.Java); d != "." {
		javac = filepath.Join(d, "javac")
	}
	out, err := exec.CommandContext(ctx, javac, "-d", tmp, cfg.Source).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("javac: %w: %s", err, out)
	}
	if err := os.Rename(tmp, dir); err != nil {
		// Another start won the race, or the rename really failed.
		if _, serr := os.Stat(filepath.Join(dir, "JavaKernel.class")); serr != nil {
			return "", err
		}
	}
	return dir, nil
}
