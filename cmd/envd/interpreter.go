package main

import (
	"context"
	"flag"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"runtime/debug"
	"strconv"
	"syscall"

	"github.com/agentbox/agentbox/internal/envd"
	"github.com/agentbox/agentbox/internal/interpreter"
)

// runInterpreter is "envd interpreter": the code interpreter of interpreter
// templates, started by their start command. It ships inside envd so no
// extra binary has to be mounted into sandboxes.
func runInterpreter(args []string) error {
	fs := flag.NewFlagSet("envd interpreter", flag.ContinueOnError)
	port := fs.Int("port", interpreter.DefaultPort, "TCP port to listen on")
	stateDir := fs.String("state-dir", "/.agentbox/interpreter", "directory for the kernels' support and connection files")
	cwd := fs.String("cwd", "", "working directory of contexts that name none (default: the current directory)")
	maxOutput := fs.Int64("max-output", 16<<20, "bytes of stdout+stderr one execution may stream before the rest is dropped")
	envdPort := fs.Int("envd-port", envd.DefaultPort, "port of this sandbox's envd, which checks /execute's access token")
	if err := fs.Parse(args); err != nil {
		return err
	}
	// Output floods pass through in ~1 MiB messages; a soft limit makes
	// the GC hand that garbage back instead of keeping a high-water mark
	// in the sandbox's memory.
	debug.SetMemoryLimit(64 << 20)
	log := slog.New(slog.NewTextHandler(os.Stderr, nil)).With("component", "interpreter")
	srv, err := interpreter.New(interpreter.Options{Logger: log, StateDir: *stateDir, Cwd: *cwd, MaxOutputBytes: *maxOutput,
		EnvdURL: "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(*envdPort))})
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	defer stop()
	return srv.ListenAndServe(ctx, net.JoinHostPort("0.0.0.0", strconv.Itoa(*port)))
}
