package bundle

import "time"

// Phases times the sub-steps of one operation for a debug log line: the
// create step's histogram says how long `start` took, this says where.
type Phases struct {
	last  time.Time
	attrs []any
}

// NewPhases starts timing at now.
func NewPhases() *Phases { return &Phases{last: time.Now()} }

// Mark ends the sub-step name at now. A nil Phases times nothing.
func (p *Phases) Mark(name string) {
	if p == nil {
		return
	}
	now := time.Now()
	p.attrs = append(p.attrs, name, now.Sub(p.last).Round(time.Microsecond))
	p.last = now
}

// Attrs are the sub-steps and their durations, as slog key-value pairs.
func (p *Phases) Attrs() []any {
	if p == nil {
		return nil
	}
	return p.attrs
}
