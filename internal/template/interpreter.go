package template

import (
	"context"
	"fmt"
	"io"
	"os/exec"

	"github.com/agentbox/agentbox/internal/runtime"
)

// codeInterpreterDefinition is the builtin template "code-interpreter-v1",
// the name E2B's code-interpreter SDKs ask for by default: Debian's Python
// data stack with ipykernel, Node.js, R with IRkernel, the JDK (for
// jshell), and the code interpreter (part of envd)
// on port 49999 as its start command. Sandbox creation waits for the
// interpreter to listen, not for its kernels; the first execution does.
func codeInterpreterDefinition(base Definition) Definition {
	return Definition{
		Name:  "code-interpreter-v1",
		Suite: DefaultSuite,
		// A layer on base: the shared base files are one copy on disk and
		// in the page cache for interpreter, browser and plain sandboxes.
		Base: &base,
		Packages: []string{
			"python3-ipykernel", "python3-numpy", "python3-pandas", "python3-matplotlib",
			// scipy drags in pythran and with it g++ and boost (~600 MB):
			// kept because analyses use it (and a compiler helps pip).
			"python3-scipy",
			// Satisfies fonttools' "scipy | munkres" should scipy be dropped.
			"python3-munkres",
			// The R kernel: IRkernel is a Jupyter kernel, driven like ipykernel.
			"r-cran-irkernel",
			// The Java kernel runs on the JDK's jshell; headless, no GUI libraries.
			"default-jdk-headless",
		},
		// Python cells (pandas on large files) need more than the default.
		MemoryMB: 2048,
		Run: []string{
			// matplotlib builds its font cache on first import (seconds);
			// do it once here, for root, who runs the kernels.
			`HOME=/root MPLBACKEND=Agg /usr/bin/python3 -c 'import matplotlib.pyplot'`,
		},
		StartCmd: runtime.EnvdPathInSandbox + " interpreter --port 49999",
		// Creation waits for the interpreter's port (a few ms after /init),
		// not for its kernels: an SDK's first request must not find the
		// port closed. One attempt polls every 10 ms, instead of the
		// manager's 250 ms between attempts.
		ReadyCmd: `timeout 30 bash -c 'until (: >/dev/tcp/127.0.0.1/49999) 2>/dev/null; do sleep 0.01; done'`,
	}
}

// runBuildCommands runs each command with /bin/sh as root chrooted into rootfs.
func runBuildCommands(ctx context.Context, cmds []string, rootfs string, progress io.Writer) error {
	for _, c := range cmds {
		fmt.Fprintf(progress, "    $ %s\n", c)
		cmd := exec.CommandContext(ctx, "chroot", rootfs, "/bin/sh", "-c", c)
		cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root", "LANG=C.UTF-8"}
		if err := runStreaming(cmd, progress); err != nil {
			return fmt.Errorf("%q: %w", c, err)
		}
	}
	return nil
}
