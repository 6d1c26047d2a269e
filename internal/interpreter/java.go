package interpreter

import (
	"context"
	"io"
	"os/exec"
)

type javaConfig struct {
	Java   string // java of a JDK (jshell's compiler is in the JDK only)
	Source string // JavaKernel.java
	Cwd    string
	Log    io.Writer
}

// startJava runs assets/JavaKernel.java, a kernel on the JDK's jshell API
// that speaks the Node kernel's protocol. The JVM runs the source file
// directly (compiling it takes about a second), so no build step or class
// files are needed in the template.
func startJava(ctx context.Context, cfg javaConfig) (*nodeKernel, error) {
	// SerialGC: fewer threads and less memory per idle kernel than G1,
	// which a sandbox with a few cores does not need.
	cmd := exec.Command(cfg.Java, "-XX:+UseSerialGC", "-Xss8m", cfg.Source)
	cmd.Dir = cfg.Cwd
	cmd.Env = kernelEnv(nil)
	return startEventKernel(ctx, &nodeKernel{name: "java kernel"}, cmd, cfg.Log)
}
