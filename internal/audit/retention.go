package audit

import (
	"context"
	"fmt"
	"time"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/store"
)

// Retention bounds the stored log. Zero fields keep everything in that
// dimension. Rows go oldest first.
type Retention struct {
	MaxAge   time.Duration // rows older than this are removed
	MaxRows  int64         // only the newest MaxRows rows are kept
	MaxBytes int64         // the whole database is kept under this size
	Interval time.Duration // how often RunRetention checks (default 1m)
}

// The defaults of `agentbox serve`: a month of history, a million rows and
// 1 GiB of database, whichever is reached first.
const (
	DefaultMaxAge          = 30 * 24 * time.Hour
	DefaultMaxRows         = 1_000_000
	DefaultMaxBytes        = 1 << 30
	defaultRetentionPeriod = time.Minute
	// pruneChunk bounds one delete transaction, so appends (which share
	// the single database connection) wait at most for one chunk.
	pruneChunk = 5000
)

// kickEvery is how many appends wake RunRetention before its interval ends,
// so a flood across many sandboxes cannot outrun it by much.
func (r Retention) kickEvery() int64 {
	if r.MaxRows > 0 {
		return max(r.MaxRows/10, 100)
	}
	return 100_000
}

// Pruned says what one retention pass removed.
type Pruned struct {
	ByAge, ByRows, BySize int64
}

// Total is every row the pass removed.
func (p Pruned) Total() int64 { return p.ByAge + p.ByRows + p.BySize }

// Prune applies the retention policy once.
func (l *Log) Prune(ctx context.Context) (Pruned, error) {
	var p Pruned
	if l.initErr != nil {
		return p, l.initErr
	}
	l.appends.Store(0)
	r := l.retention
	var err error
	if r.MaxAge > 0 {
		if p.ByAge, err = l.pruneAll(ctx, store.PruneFilter{Before: time.Now().Add(-r.MaxAge)}); err != nil {
			return p, err
		}
	}
	if r.MaxRows > 0 {
		if p.ByRows, err = l.pruneAll(ctx, store.PruneFilter{KeepRows: r.MaxRows}); err != nil {
			return p, err
		}
	}
	if r.MaxBytes > 0 {
		if p.BySize, err = l.pruneToSize(ctx, r.MaxBytes); err != nil {
			return p, err
		}
	}
	return p, nil
}

// pruneAll removes every row f selects, a chunk at a time.
func (l *Log) pruneAll(ctx context.Context, f store.PruneFilter) (int64, error) {
	var total int64
	for {
		n, err := l.st.PruneAudit(ctx, f, pruneChunk)
		total += n
		if err != nil || n < pruneChunk {
			return total, err
		}
	}
}

// pruneToSize removes the oldest rows until the database's used bytes are
// under maxBytes (or the log is empty: the rest of the database is not the
// log's to remove).
func (l *Log) pruneToSize(ctx context.Context, maxBytes int64) (int64, error) {
	var total int64
	for {
		used, err := l.st.UsedBytes(ctx)
		if err != nil || used <= maxBytes {
			return total, err
		}
		rows, err := l.st.AuditRows(ctx)
		if err != nil || rows == 0 {
			return total, err
		}
		// Remove the share of rows the excess is of the database, plus a
		// margin, so this converges in a few rounds.
		n := min(max(rows*(used-maxBytes)/used+rows/20, 100), pruneChunk)
		f := store.PruneFilter{KeepRows: rows - n}
		if rows <= n {
			f = store.PruneFilter{Before: time.Now().Add(24 * time.Hour)} // every row
		}
		removed, err := l.st.PruneAudit(ctx, f, 0)
		total += removed
		if err != nil || removed == 0 {
			return total, err
		}
	}
}

// RunRetention applies the policy every Interval, and early when many rows
// came in, until ctx ends.
func (l *Log) RunRetention(ctx context.Context) {
	every := l.retention.Interval
	if every <= 0 {
		every = defaultRetentionPeriod
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		if p, err := l.Prune(ctx); err != nil {
			if ctx.Err() == nil {
				l.log.Error("audit retention failed", "err", err)
			}
		} else if p.Total() > 0 {
			l.log.Info("audit retention removed old rows", "byAge", p.ByAge, "byRows", p.ByRows, "bySize", p.BySize)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-l.kick:
		}
	}
}

// PruneRequest is an operator's explicit prune (`agentbox audit prune`).
type PruneRequest struct {
	OlderThan time.Duration // rows older than this
	SandboxID string        // rows of this sandbox
}

// PruneNow removes the rows req selects: those of the sandbox, older than
// the age, or both. It refuses a request that selects nothing in particular.
func (l *Log) PruneNow(ctx context.Context, req PruneRequest) (int64, error) {
	if l.initErr != nil {
		return 0, l.initErr
	}
	if req.OlderThan < 0 {
		return 0, fmt.Errorf("--older-than %s: must not be negative: %w", req.OlderThan, errdefs.ErrInvalidArgument)
	}
	f := store.PruneFilter{SandboxID: req.SandboxID}
	if req.OlderThan > 0 {
		f.Before = time.Now().Add(-req.OlderThan)
	}
	if f.Before.IsZero() && f.SandboxID == "" {
		return 0, fmt.Errorf("say what to prune: --older-than AGE, --sandbox ID or both: %w", errdefs.ErrInvalidArgument)
	}
	return l.pruneAll(ctx, f)
}
