// Command envd is the daemon inside every sandbox. Run as PID 1 it is also
// the sandbox's init: it reaps orphans beside serving ("serve" runs the
// server alone).
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
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"

	"github.com/agentbox/agentbox/internal/envd"
	"github.com/agentbox/agentbox/internal/guestinit"
)

func main() {
	if len(os.Args) > 2 && os.Args[1] == "reap" && (os.Args[2] == "--" || os.Args[2] == "--cred") {
		// A command's reaper (internal/envd/reaper_linux.go). It holds no
		// secret; it runs as root, the command as --cred's ids; left
		// dumpable, CRIU can checkpoint it across pauses.
		os.Exit(envd.RunReaper(os.Args[2:]))
	}
	if len(os.Args) == 3 && os.Args[1] == "reap" && os.Args[2] == "--spare" {
		// A reaper started ahead of its command (spare_linux.go).
		os.Exit(envd.RunSpareReaper())
	}
	if guestinit.IsGuest() {
		// A microVM's first process: set the guest up, then exec envd
		// as its init. Returning means the guest cannot run.
		err := guestinit.Run()
		fmt.Fprintln(os.Stderr, "envd: microvm init:", err)
		os.Exit(1)
	}
	// First: until this returns, sandbox root could ptrace every envd
	// process (init, server, interpreter) and read its token. CRIU (host
	// root) dumps and restores the flag; dumping a sandbox CRIU restored
	// needs our CRIU patch (scripts/criu-userns-nondumpable.patch).
	if err := envd.SetNonDumpable(); err != nil {
		fmt.Fprintln(os.Stderr, "envd:", err)
		os.Exit(1)
	}
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "envd:", err)
		os.Exit(1)
	}
}

// parseSyscalls parses a comma-separated list of syscall numbers.
func parseSyscalls(s string) ([]uint32, error) {
	var out []uint32
	for f := range strings.SplitSeq(s, ",") {
		n, err := strconv.ParseUint(strings.TrimSpace(f), 10, 32)
		if err != nil || n > 1023 {
			return nil, fmt.Errorf("--audit-syscalls: %q is not a syscall number", f)
		}
		out = append(out, uint32(n))
	}
	return out, nil
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
	auditSyscalls := fs.String("audit-syscalls", "", "as init: x86_64 syscall numbers (comma-separated) the sandbox's seccomp policy refuses, to refuse again with kernel audit logging on (see internal/envd/auditfilter_linux.go)")
	microvmGuest := fs.Bool(guestinit.GuestFlag[2:], false, "as init: a microVM guest's, which takes new network settings from the host after a restore")
	userPIDs := fs.Int64("user-pids", 0, "as init: make the user cgroup (where commands run) in the sandbox's own cgroupfs with this many tasks at most, the rest of the sandbox's being envd's reserve (the gVisor tier; elsewhere the server makes it); 0: none")
	userMemory := fs.Int64("user-memory", 0, "as init, with --user-pids: the user cgroup's memory limit in bytes; 0: none")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *version {
		fmt.Println(envd.Version)
		return nil
	}

	var out io.Writer = os.Stderr
	if *logFile != "" {
		f, err := os.OpenFile(*logFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			return fmt.Errorf("open log file: %w", err)
		}
		defer f.Close()
		out = io.MultiWriter(os.Stderr, f)
		// A crash (a panic outside a request) ends the sandbox's init and
		// so the sandbox; its trace lands beside the log, not only on a
		// stderr nobody reads.
		_ = debug.SetCrashOutput(f, debug.CrashOptions{})
	}
	log := slog.New(slog.NewTextHandler(out, nil))

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	defer stop()
	opts := envd.Options{Logger: log}
	if os.Getpid() == 1 && !serveMode {
		// envd is the sandbox's init and its server in one process (one
		// Go start): see envd.Children for how it reaps orphans without
		// taking its own children's exit statuses.
		if *auditSyscalls != "" {
			nrs, err := parseSyscalls(*auditSyscalls)
			if err == nil {
				err = envd.LogRefusals(nrs)
			}
			if err != nil {
				log.Warn("refused syscalls will not be audited", "err", err)
			}
		}
		if *userPIDs > 0 {
			if err := envd.MakeUserCgroup(*userPIDs, *userMemory); err != nil {
				log.Warn("envd keeps no reserve of pids and memory: commands share the sandbox's limits with it", "err", err)
			}
		}
		// Before anything else starts: nothing in the sandbox keeps it.
		if err := envd.DropSysAdmin(); err != nil {
			return err
		}
		if *microvmGuest {
			go func() {
				if err := guestinit.WatchNetwork(ctx, log); err != nil {
					log.Warn("network settings of restores will not apply", "err", err)
				}
			}()
		}
		opts.Children = envd.NewChildren()
		go opts.Children.ReapOrphans(ctx)
	}
	srv := envd.NewServer(opts)
	return srv.ListenAndServe(ctx, net.JoinHostPort("0.0.0.0", strconv.Itoa(*port)))
}
