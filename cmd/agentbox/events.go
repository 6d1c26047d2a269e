package main

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/spf13/cobra"

	agentbox "github.com/agentbox/agentbox/sdk/go"
)

func newEventsCmd() *cobra.Command {
	var (
		asJSON bool
		limit  int
		offset int
		types  []string
		all    bool
	)
	cmd := &cobra.Command{
		Use:   "events [<id>]",
		Short: "Print a sandbox's lifecycle events: created, updated, paused, resumed, checkpointed, killed, policy violations",
		Long: `Print the lifecycle events of a sandbox (E2B's events API,
GET /events/sandboxes/{id}), oldest first: created, updated, paused, resumed,
checkpointed and killed, and sandbox.policy.violation, one per sandbox, rule
and window, when it keeps hitting a wall (refused syscalls, denied egress,
out of memory, process limit, full disk). Events outlive the sandbox; the
server keeps them for --events-max-age. With --all, every sandbox of the team.`,
		Example: `  agentbox events i1a2b3c
  agentbox events i1a2b3c --type sandbox.lifecycle.killed --json
  agentbox events --all --limit 100`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id := ""
			if len(args) == 1 {
				id = args[0]
			} else if !all {
				return fmt.Errorf("name a sandbox id, or --all for every sandbox of the team")
			}
			page, err := newClient(cmd).SandboxEventsPage(cmd.Context(), id, agentbox.EventsOptions{Types: types, Offset: offset, Limit: limit})
			if err != nil {
				return err
			}
			if page.Incomplete != "" {
				// Said apart from the events, so --json output stays parseable.
				fmt.Fprintf(cmd.ErrOrStderr(), "warning: some events could not be read: %s\n", page.Incomplete)
			}
			evs := page.Events
			// The server pages newest first (the newest N); print them in order.
			sort.SliceStable(evs, func(i, j int) bool { return evs[i].Timestamp.Before(evs[j].Timestamp) })
			out := cmd.OutOrStdout()
			for _, e := range evs {
				if err := printEvent(out, e, asJSON, id == ""); err != nil {
					return err
				}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.BoolVar(&asJSON, "json", false, "print one JSON object per event, as the API sends it")
	f.IntVar(&limit, "limit", 100, "only the newest N events (1 to 100)")
	f.IntVar(&offset, "offset", 0, "skip the newest N events (page back)")
	f.StringSliceVar(&types, "type", nil, "only these types, e.g. sandbox.lifecycle.killed,sandbox.policy.violation")
	f.BoolVar(&all, "all", false, "events of every sandbox of the team")
	return cmd
}

func printEvent(w io.Writer, e agentbox.SandboxEvent, asJSON, withID bool) error {
	if asJSON {
		return json.NewEncoder(w).Encode(e)
	}
	what := strings.TrimPrefix(strings.TrimPrefix(e.Type, "sandbox.lifecycle."), "sandbox.")
	var detail []string
	keys := make([]string, 0, len(e.EventData))
	for k := range e.EventData {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if k == "sandbox_metadata" {
			continue
		}
		b, _ := json.Marshal(e.EventData[k])
		detail = append(detail, k+"="+string(b))
	}
	id := ""
	if withID {
		id = e.SandboxID + " "
	}
	_, err := fmt.Fprintf(w, "%s %s%-16s %s\n", e.Timestamp.Local().Format("2006-01-02 15:04:05.000"), id, what, strings.Join(detail, " "))
	return err
}
