package main

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/agentbox/agentbox/internal/audit"
	"github.com/agentbox/agentbox/internal/egress"
)

// newAuditCmd is `agentbox audit prune`: the operator's explicit way to
// remove audit rows, on the server's own database. It is the retention
// path the audit table's triggers allow (internal/store/audit.go); nothing
// a sandbox or a tenant can reach calls it.
func newAuditCmd() *cobra.Command {
	var dataDir string
	cmd := &cobra.Command{
		Use:   "audit",
		Short: "Maintain the audit log (on the server's data directory)",
		Long: `Maintain the audit log in the server's database (run on the server host as a
user who can read --data-dir). The server itself keeps the log bounded with
serve --audit-max-age, --audit-max-rows and --audit-max-bytes; tenants read
their sandboxes' events with ` + "`agentbox logs`" + `.`,
	}
	cmd.PersistentFlags().StringVar(&dataDir, "data-dir", defaultDataDir(), "server data directory")

	var olderThan days
	var sandboxID string
	prune := &cobra.Command{
		Use:   "prune",
		Short: "Remove audit events older than an age, of one sandbox, or both",
		Long: `Remove audit events from the server's database: those older than --older-than,
those of --sandbox, or (both given) those of the sandbox older than the age.
At least one is required. Removed events are gone for good.`,
		Example: `  agentbox audit prune --older-than 7d
  agentbox audit prune --sandbox i1a2b3c
  agentbox audit prune --sandbox i1a2b3c --older-than 12h`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			st, err := openStore(ctx, dataDir)
			if err != nil {
				return err
			}
			defer st.Close()
			n, err := audit.New(st).PruneNow(ctx, audit.PruneRequest{OlderThan: time.Duration(olderThan), SandboxID: sandboxID})
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "removed %d audit events\n", n)
			return nil
		},
	}
	prune.Flags().Var(&olderThan, "older-than", "remove events older than this (e.g. 30d, 12h)")
	prune.Flags().StringVar(&sandboxID, "sandbox", "", "remove events of this sandbox")
	cmd.AddCommand(prune)
	return cmd
}

// days is a duration flag that also takes whole days ("30d").
type days time.Duration

var _ pflag.Value = (*days)(nil)

func (d *days) String() string {
	v := time.Duration(*d)
	if v != 0 && v%(24*time.Hour) == 0 {
		return strconv.FormatInt(int64(v/(24*time.Hour)), 10) + "d"
	}
	return v.String()
}

func (d *days) Set(s string) error {
	if n, ok := strings.CutSuffix(s, "d"); ok {
		v, err := strconv.ParseUint(n, 10, 32)
		if err != nil {
			return fmt.Errorf("%q: want whole days like 30d, or a duration like 12h", s)
		}
		*d = days(time.Duration(v) * 24 * time.Hour)
		return nil
	}
	v, err := time.ParseDuration(s)
	if err != nil || v < 0 {
		return fmt.Errorf("%q: want whole days like 30d, or a duration like 12h", s)
	}
	*d = days(v)
	return nil
}

func (d *days) Type() string { return "duration" }

// auditFlags are serve's audit log bounds.
type auditFlags struct {
	MaxAge   days
	MaxRows  int64
	MaxBytes int64
	Rate     float64
	Burst    int
}

func addAuditFlags(f *pflag.FlagSet, a *auditFlags) {
	a.MaxAge = days(audit.DefaultMaxAge)
	f.Var(&a.MaxAge, "audit-max-age", "audit events older than this are removed (e.g. 30d, 12h; 0 keeps them)")
	f.Int64Var(&a.MaxRows, "audit-max-rows", audit.DefaultMaxRows, "keep at most this many audit events, the newest (0: no cap)")
	f.Int64Var(&a.MaxBytes, "audit-max-bytes", audit.DefaultMaxBytes, "remove the oldest audit events while the database is larger than this (0: no cap)")
	f.Float64Var(&a.Rate, "audit-rate", audit.DefaultRate, "audit events per second one sandbox may add of one kind (process, file, egress, limit, syscall) after its burst; the rest are counted in \"suppressed\" events, egress ones per destination and decision (ports folded per address, then addresses per /24 and /16, names per domain, when a window holds too many) (-1: no limit)")
	f.IntVar(&a.Burst, "audit-burst", audit.DefaultBurst, "audit events one sandbox may add of one kind at once before --audit-rate applies")
}

// options turns the flags into the audit log's options.
func (a auditFlags) options() ([]audit.Option, error) {
	if a.MaxRows < 0 || a.MaxBytes < 0 {
		return nil, fmt.Errorf("--audit-max-rows and --audit-max-bytes must not be negative (0 turns the cap off)")
	}
	if a.Burst < 1 {
		return nil, fmt.Errorf("--audit-burst %d: must be at least 1", a.Burst)
	}
	if a.Rate == 0 {
		return nil, fmt.Errorf("--audit-rate 0 would record nothing but counts; use a positive rate, or -1 for no limit")
	}
	return []audit.Option{
		audit.WithLimits(audit.Limits{Rate: a.Rate, Burst: a.Burst}),
		audit.WithRetention(audit.Retention{MaxAge: time.Duration(a.MaxAge), MaxRows: a.MaxRows, MaxBytes: a.MaxBytes}),
	}, nil
}

// egressLimits hands --audit-rate and --audit-burst to the egress proxy,
// which limits (and aggregates per destination) every egress record.
func (a auditFlags) egressLimits() egress.Limits {
	if a.Rate < 0 {
		return egress.Limits{AuditRate: math.Inf(1), AuditBurst: math.MaxInt}
	}
	return egress.Limits{AuditRate: a.Rate, AuditBurst: a.Burst}
}

// runAudit starts retention and returns a function that writes the counts
// of suppressed events still pending (at shutdown).
func runAudit(ctx context.Context, l *audit.Log) func() {
	go l.RunRetention(ctx)
	return func() { _ = l.Flush(context.WithoutCancel(ctx)) }
}
