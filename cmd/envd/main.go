// Command envd is the daemon inside every sandbox. Run as PID 1 it becomes a
// small init that supervises the real server (itself, with "serve").
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strconv"
	"syscall"

	"github.com/agentbox/agentbox/internal/envd"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "envd:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) > 0 && args[0] == "interpreter" {
		return runInterpreter(args[1:])
	}
	serveMode := len(args) > 0 && args[0] == "serve"
	if serveMode {
		args = args[1:]
	}
	fs := flag.NewFlagSet("envd", flag.ContinueOnError)
	port := fs.Int("port", envd.DefaultPort, "TCP port to listen on")
	logFile := fs.String("log-file", "", "also append logs to this file")
	version := fs.Bool("version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *version {
		fmt.Println(envd.Version)
		return nil
	}

	if os.Getpid() == 1 && !serveMode {
		// The log file is opened by the server child; init logs to stderr only.
		return envd.RunInit(context.Background(), slog.New(slog.NewTextHandler(os.Stderr, nil)), append([]string{"serve"}, args...))
	}

	var out io.Writer = os.Stderr
	if *logFile != "" {
		f, err := os.OpenFile(*logFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			return fmt.Errorf("open log file: %w", err)
		}
		defer f.Close()
		out = io.MultiWriter(os.Stderr, f)
	}
	log := slog.New(slog.NewTextHandler(out, nil))

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	defer stop()
	srv := envd.NewServer(envd.Options{Logger: log})
	return srv.ListenAndServe(ctx, net.JoinHostPort("0.0.0.0", strconv.Itoa(*port)))
}
