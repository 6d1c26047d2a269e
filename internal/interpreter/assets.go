package interpreter

import (
	_ "embed"
	"fmt"
	"os"
	"path/filepath"
)

// Files the kernels need, shipped inside envd so a template only has to
// provide the language runtimes (Debian packages).
var (
	//go:embed assets/ipython_kernel_config.py
	ipythonKernelConfig []byte
	//go:embed assets/ipython_startup.py
	ipythonStartup []byte
	//go:embed assets/node_kernel.js
	nodeKernelJS []byte
	//go:embed assets/JavaKernel.java
	javaKernelJava []byte
)

// layout is where the server keeps its files inside the sandbox.
type layout struct {
	IPythonDir  string // IPYTHONDIR of Python kernels
	NodeKernel  string // the Node kernel's script
	JavaKernel  string // the Java kernel's source file
	JavaClasses string // the Java kernel compiled, per version
	RuntimeDir  string // connection files, bash cell files
}

// writeAssets writes the kernels' support files below dir.
func writeAssets(dir string) (layout, error) {
	l := layout{
		IPythonDir:  filepath.Join(dir, "ipython"),
		NodeKernel:  filepath.Join(dir, "node_kernel.js"),
		JavaKernel:  filepath.Join(dir, "JavaKernel.java"),
		JavaClasses: filepath.Join(dir, "java-classes"),
		RuntimeDir:  filepath.Join(dir, "run"),
	}
	profile := filepath.Join(l.IPythonDir, "profile_default")
	files := map[string][]byte{
		filepath.Join(profile, "ipython_kernel_config.py"):          ipythonKernelConfig,
		filepath.Join(profile, "startup", "00-agentbox-formats.py"): ipythonStartup,
		l.NodeKernel: nodeKernelJS,
		l.JavaKernel: javaKernelJava,
	}
	for _, d := range []string{filepath.Join(profile, "startup"), l.RuntimeDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return l, fmt.Errorf("interpreter files: %w", err)
		}
	}
	if err := os.Chmod(l.RuntimeDir, 0o700); err != nil {
		return l, fmt.Errorf("interpreter files: %w", err)
	}
	for p, b := range files {
		if err := os.WriteFile(p, b, 0o644); err != nil {
			return l, fmt.Errorf("interpreter files: %w", err)
		}
	}
	return l, nil
}
