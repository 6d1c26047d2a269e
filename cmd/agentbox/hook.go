package main

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/agentbox/agentbox/internal/confine"
	"github.com/agentbox/agentbox/internal/localrun"
	"github.com/agentbox/agentbox/internal/objstore"
	"github.com/agentbox/agentbox/internal/runtime/bundle"
	"github.com/agentbox/agentbox/internal/runtime/runc"
	"github.com/agentbox/agentbox/internal/template"
	// Joins a sandbox's user namespace before the Go runtime starts, for
	// the hooks that run inside one (as `runc init` does).
	"github.com/agentbox/agentbox/internal/runtime/nsjoin"
)

// newHookCmd is `agentbox __hook <name> [flags]`: the runtime's helpers, run
// by the server itself or by runc as an OCI hook. Hidden: only the server
// calls it, with arguments it made.
func newHookCmd() *cobra.Command {
	return &cobra.Command{
		Use:                "__hook <name> [flags]",
		Short:              "Run one of the server's runtime helpers (internal)",
		Hidden:             true,
		DisableFlagParsing: true,
		Args:               cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runHook(args[0], args[1:])
		},
	}
}

// runHook dispatches one hook by name.
func runHook(name string, args []string) error {
	switch name {
	case runc.UserNSLimitsHook:
		return runc.RunUserNSLimitsHook(args, nsjoin.Joined())
	case runc.PlugWaitHook:
		return runc.RunPlugWaitHook(args)
	case runc.BootIDHook:
		return runc.RunBootIDHook(args, nsjoin.Joined(), nsjoin.Limited())
	case bundle.HoldHook:
		// nsjoin's constructor runs it when called without arguments.
		return fmt.Errorf("%s hook takes no arguments, got %q", bundle.HoldHook, args)
	case confine.Hook:
		if len(args) != 1 {
			return fmt.Errorf("%s hook takes one argument", confine.Hook)
		}
		return confine.RunHook(args[0])
	case template.UnpackHook:
		return template.RunUnpackHook(args)
	case objstore.UnpackHook:
		return objstore.RunUnpackHook(args)
	case localrun.InitHook:
		if len(args) != 1 {
			return fmt.Errorf("%s hook takes one argument", localrun.InitHook)
		}
		return localrun.RunInit(args[0])
	case "":
		return errors.New("__hook: name a hook")
	}
	return fmt.Errorf("__hook: unknown hook %q (want %s, %s, %s, %s, %s, %s, %s or %s)", name, runc.PlugWaitHook, runc.UserNSLimitsHook, runc.BootIDHook, bundle.HoldHook, localrun.InitHook, confine.Hook, template.UnpackHook, objstore.UnpackHook)
}
